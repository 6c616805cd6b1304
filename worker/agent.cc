#include "worker/agent.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <variant>

#include "cluster/change_request.h"
#include "cluster/durable.h"
#include "cluster/job_state.h"
#include "cluster/keys.h"
#include "cluster/peer_client.h"
#include "cluster/recovery.h"
#include "ptc/base/checksum.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store_layout.h"
#include "worker/job_report.h"

namespace ptcfs::worker {
namespace {

// The longest the agent sleeps between two looks at etcd (a watch wakes it
// at once when a key of the job changes), and how often it looks when it
// cannot watch. The longest also bounds how long an unmount waits for it.
constexpr std::chrono::milliseconds kFollowEvery{1000};
constexpr std::chrono::milliseconds kPollWithoutWatch{50};


// A change the job agreed, as this worker applies it (fs/participant.h):
// its part is published and the commit awaited through the coordinator.
class AppliedChange final : public AgreedChange {
 public:
  // `saved` is set to the change's generation once a save commits (Agent::Replicate);
  // `server` serves the part this worker writes from its publication on (shared:
  // a change may still publish while the agent stops).
  AppliedChange(ptc::cluster::Change change, std::set<int> participants, const ptc::cluster::Coordinator* coordinator,
                const ptc::Store* store, ptc::Env* env, const WorkerOptions& options, std::atomic<uint64_t>* saved,
                std::shared_ptr<ptc::cluster::PeerServer> server)
      : change_(std::move(change)),
        participants_(std::move(participants)),
        coordinator_(coordinator),
        store_(store),
        env_(env),
        job_(options.job),
        durable_(options.durable),
        options_worker_(options.worker),
        saved_(saved),
        server_(std::move(server)) {}

  const std::set<int>& participants() const override { return participants_; }

  ptc::Status BeforeCommit(ptc::GenerationWriter& writer, const std::string& config) override {
    auto fixed = [&config](const std::map<int, ptc::Part>&) -> ptc::Result<std::string> { return config; };
    return Publish(writer, store_->CurrentSnapshot()->tensors, nlohmann::json::object(), fixed, /*save=*/false)
        .status();
  }

  ptc::Result<std::map<int, ptc::Part>> BeforeSaveCommit(ptc::GenerationWriter& writer,
                                                         const std::vector<ptc::TensorRecord>& tensors,
                                                         const nlohmann::json& extra, const SettleFn& settle) override {
    PTC_ASSIGN_OR_RETURN(auto parts, Publish(writer, tensors, extra, settle, /*save=*/true));
    *saved_ = change_.generation;  // committed: an aborted save's generation is a later change's
    return parts;
  }

  void Failed(const ptc::Status& error) override { coordinator_->Fail(change_, error); }

  bool has_last_resort() const override { return !durable_.empty(); }

  // The part written into `writer` (pieces in its generation's directory;
  // the others it lists are referenced from older generations) to the job:
  // once committed, the others' pieces go into the writer. A save's pieces
  // are new tensor bytes (Committed::contents).
  ptc::Result<std::map<int, ptc::Part>> Publish(ptc::GenerationWriter& writer,
                                                const std::vector<ptc::TensorRecord>& tensors,
                                                const nlohmann::json& extra, const SettleFn& settle, bool save) {
    // The part is durable before the job may count on it.
    PTC_RETURN_IF_ERROR(store_->env()->SyncFileSystem(store_->root()));
    const std::string prefix = ptc::GenerationDirName(writer.generation()) + "/";
    ptc::Part mine{{}, extra};
    std::vector<ptc::ShardRecord> referenced;
    for (ptc::ShardRecord& s : writer.Shards()) (s.file.starts_with(prefix) ? mine.shards : referenced).push_back(s);
    // Served from now on: a worker that commits the change before this one
    // does may pull these pieces for the next change at once.
    auto served = std::make_shared<ptc::GenerationManifest>();
    served->generation = writer.generation();
    served->shards = mine.shards;
    server_->ServePart(std::move(served));
    PTC_ASSIGN_OR_RETURN(auto parts,
                         coordinator_->Finish(change_, settle, mine, referenced, tensors, /*new_contents=*/save));
    for (auto& [w, part] : parts) {
      if (w == options_worker_) continue;
      for (const ptc::ShardRecord& s : part.shards) writer.AddShard(s);
    }
    return parts;
  }

  ptc::Result<std::vector<ptc::ShardRecord>> LastResort() override {
    if (durable_.empty()) return ptc::FailedPreconditionError("the job has no durable tier");
    PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::Committed> committed, coordinator_->GetCommitted());
    if (!committed) return ptc::FailedPreconditionError("the job has no committed generation");
    // A directory is read through the store's env (local paths), a bucket through its own.
    ptc::Env* tier = durable_.env ? durable_.env.get() : env_;
    return ptc::cluster::LoadDurable(tier, durable_.dir, {job_, committed->contents}, store_->CurrentSnapshot()->tensors);
  }

 private:
  const ptc::cluster::Change change_;
  const std::set<int> participants_;
  const ptc::cluster::Coordinator* const coordinator_;
  const ptc::Store* const store_;
  ptc::Env* const env_;
  const std::string job_;
  const ptc::cluster::DurableLocation durable_;
  const int options_worker_;
  std::atomic<uint64_t>* const saved_;
  const std::shared_ptr<ptc::cluster::PeerServer> server_;
};

// Whether the change's request is a compaction (one whose request is no
// request at all is not).
bool IsCompaction(const ptc::cluster::Change& change) {
  auto request = ptc::cluster::DecodeRequest("change " + change.id, change.request);
  return request.ok() && std::holds_alternative<ptc::cluster::CompactionRequest>(*request);
}

// One callable of a lambda per alternative, for std::visit.
template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
// clang 14 does not deduce an aggregate's template arguments (C++20 P1816) by itself.
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// How long a proposal waits for a compaction that committed before it could
// give way to be served by this mount (its commit follows the job's at once).
constexpr std::chrono::seconds kOvertakeWait{10};

}  // namespace

Agent::~Agent() {
  fs_->controller().SetParticipant(nullptr);  // no FUSE thread calls into the agent from here on
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  durable_.reset();
  env_->SetCurrent(nullptr);
  if (membership_) (void)membership_->Leave();
  if (server_) server_->Stop();
}

ptc::Status Agent::Start() {
  ptc::cluster::PeerServerOptions server;
  server.address = options_.listen.host;
  server.port = options_.listen.port;
  server.token = options_.token;
  server.worker = options_.worker;
  PTC_ASSIGN_OR_RETURN(server_, ptc::cluster::PeerServer::Start(&fs_->store(), server));
  env_->SetCurrent([store = &fs_->store()] { return store->CurrentSnapshot(); });
  PTC_ASSIGN_OR_RETURN(membership_,
                       ptc::cluster::Membership::Join(
                           kv_, {options_.job, options_.worker, options_.listen.ToString(), options_.lease_seconds}));
  rejoin_ = {kv_, coordinator_, membership_->options(), {}};
  rejoin_.client.token = options_.token;
  Follow();
  fs_->controller().SetParticipant(this);
  if (!options_.durable.empty()) {
    durable_ = std::make_unique<DurableKeeper>(options_.durable, options_.job, options_.worker, env_, fs_, coordinator_);
  }
  thread_ = std::thread([this] { Loop(); });
  return ptc::Status::OK();
}

ptc::Result<ptc::cluster::Change> Agent::ProposeToJob(const ptc::cluster::ChangeRequest& request,
                                                      const std::vector<int>& needed, const std::string& again) {
  if (!member_) {
    return ptc::FailedPreconditionError("worker " + std::to_string(options_.worker) + " is not a member of job " +
                                        options_.job + " now (etcd out of reach, or it rejoins): " + again +
                                        " once .ptcfs/status shows no error");
  }
  PTC_RETURN_IF_ERROR(ptc::cluster::ValidateRequest(request));
  const std::string text = ptc::cluster::EncodeRequest(request);
  if (!std::holds_alternative<ptc::cluster::CompactionRequest>(request)) OvertakeCompaction(text);
  PTC_ASSIGN_OR_RETURN(std::vector<ptc::cluster::Member> members, ptc::cluster::ListMembers(*kv_, options_.job));
  std::vector<int> workers;
  for (const ptc::cluster::Member& m : members) workers.push_back(m.worker);
  return coordinator_->Propose(text, fs_->store().CurrentSnapshot()->generation, workers, needed);
}

ptc::Status Agent::Propose(const std::string& text, const ptc::ParallelConfig& config) {
  // The request as written to .ptcfs/config, less its line end: it names the change in every worker's messages.
  const std::string request = text.substr(0, text.find_last_not_of(" \t\r\n") + 1);
  PTC_ASSIGN_OR_RETURN(ptc::cluster::Change change,
                       ProposeToJob(ptc::cluster::RelayoutRequest{request}, config.Workers(), "try again"));
  ptc::MutexLock lock(&proposed_mu_);
  proposed_ = std::move(change);
  return ptc::Status::OK();
}

ptc::Result<std::shared_ptr<AgreedChange>> Agent::ProposeDcpSave(const std::string& save, const std::string& metadata) {
  ptc::cluster::DcpSaveRequest request{options_.worker, metadata.size(), ptc::Xxh64(metadata.data(), metadata.size()),
                                       save};
  if (request.bytes > ptc::cluster::kMaxDcpMetadataBytes) {
    return ptc::InvalidArgumentError(save + "/.metadata: " + std::to_string(metadata.size()) +
                                     " bytes, more than a job carries (" +
                                     std::to_string(ptc::cluster::kMaxDcpMetadataBytes) + ")");
  }
  // The other workers fetch the .metadata from this worker's server (it grows with the
  // tensors: 164 MiB for DeepSeek-V3, too much for etcd), published before the change names it.
  server_->Publish(save, std::make_shared<const std::string>(metadata));
  auto change = ProposeToJob(request, {}, "save again");
  if (!change.ok()) {
    server_->Withdraw(save);
    return change.status();
  }
  std::set<int> participants(change->workers.begin(), change->workers.end());
  // Withdrawn once this worker's part is over: committed, every other worker fetched it before it
  // published its part; aborted, no one needs it.
  return std::shared_ptr<AgreedChange>(new AppliedChange(std::move(*change), std::move(participants), coordinator_,
                                                         &fs_->store(), env_, options_, &saved_, server_),
                                       [server = server_, save](AgreedChange* done) {
                                         delete done;
                                         server->Withdraw(save);
                                       });
}

ptc::Result<std::shared_ptr<AgreedChange>> Agent::ProposeSave(uint64_t iteration) {
  PTC_ASSIGN_OR_RETURN(ptc::cluster::Change change,
                       ProposeToJob(ptc::cluster::SaveRequest{iteration}, {}, "save again"));
  std::set<int> participants(change.workers.begin(), change.workers.end());
  return std::shared_ptr<AgreedChange>(std::make_shared<AppliedChange>(
      std::move(change), std::move(participants), coordinator_, &fs_->store(), env_, options_, &saved_, server_));
}

void Agent::OvertakeCompaction(const std::string& request) {
  auto pending = coordinator_->Pending();
  if (!pending.ok() || !*pending || !IsCompaction(**pending)) return;
  coordinator_->Withdraw(**pending, std::string(kCompactionGivesWay) + "'" + request + "' asked on worker " +
                                        std::to_string(options_.worker));
  const auto deadline = std::chrono::steady_clock::now() + kOvertakeWait;
  while (std::chrono::steady_clock::now() < deadline) {
    auto committed = coordinator_->GetCommitted();
    if (!committed.ok() || !*committed || (*committed)->generation == fs_->store().current_generation()) return;
    std::this_thread::sleep_for(kPollWithoutWatch);
  }
}

std::optional<ptc::cluster::Change> Agent::Proposed() {
  ptc::MutexLock lock(&proposed_mu_);
  return proposed_;
}

void Agent::Settle(const ptc::cluster::Change& asked, const ptc::Result<std::optional<ptc::cluster::Change>>& pending) {
  if (asked.id != applied_) {
    if (!pending.ok() || (*pending && (*pending)->id == asked.id)) return;
    fs_->controller().EndProposal(coordinator_->Aborted(asked), asked.id == recovery_);
  }
  ptc::MutexLock lock(&proposed_mu_);
  if (proposed_ && proposed_->id == asked.id) proposed_.reset();
}

ptc::Result<std::string> Agent::DcpMetadata(const ptc::cluster::DcpSaveRequest& r) const {
  if (r.worker == options_.worker) {
    if (auto mine = server_->Published(r.save)) return *mine;
    return ptc::NotFoundError("its .metadata is no longer published here (the proposal ended)");
  }
  auto peer = peers_.find(r.worker);
  if (peer == peers_.end()) {
    return ptc::FailedPreconditionError("its .metadata: worker " + std::to_string(r.worker) + " that proposed it is not live");
  }
  return ptc::cluster::PeerClient({.token = options_.token}).FetchPublished(peer->second, r.save, r.bytes, r.checksum);
}

int64_t Agent::Follow(std::vector<int>* live) {
  int64_t revision = 0;
  auto members = membership_->Members(&revision);
  if (!members.ok()) revision = 0;
  if (members.ok()) {
    std::map<int, ptc::cluster::PeerAddress> peers;
    for (const ptc::cluster::Member& m : *members) {
      if (auto a = ptc::cluster::ParsePeerAddress(m.address); a.ok()) peers[m.worker] = *a;
      if (live != nullptr) live->push_back(m.worker);
    }
    peers_ = peers;
    env_->SetPeers(std::move(peers));
  }
  auto current = fs_->store().CurrentSnapshot();
  if (current != served_.front()) {
    served_ = {current, served_.front()};  // the previous one: readers of older files
    env_->SetManifests(served_);
    server_->SetKeptGenerations({served_[1]});
  }
  return revision;
}

void Agent::Loop() {
  while (!stop_) {
    std::vector<int> live;
    const int64_t revision = Follow(&live);
    seen_.insert(live.begin(), live.end());
    const std::optional<ptc::cluster::Change> asked = Proposed();  // before Pending: a change it names is in etcd
    auto pending = coordinator_->Pending();
    if (pending.ok() && *pending && revision > 0) WithdrawOrphan(**pending, live);
    const bool member = InStep(pending);  // a worker that rejoins neither applies, recovers nor copies
    if (member && pending.ok() && *pending) Apply(**pending);
    if (asked) Settle(*asked, pending);
    if (member && pending.ok() && !*pending && revision > 0) {
      Recover(live);
      NoteWhole(live);
      if (!Resume(live) && !Replicate(live)) Compact(live);
    }
    if (member && pending.ok() && !*pending && durable_) durable_->Look();
    if (revision > 0) Report(live);
    if (stop_) break;
    if (revision > 0 && kv_->WaitForChange(ptc::cluster::JobPrefix(options_.job), revision, kFollowEvery).ok()) {
      continue;
    }
    std::this_thread::sleep_for(kPollWithoutWatch);
  }
}

void Agent::WithdrawOrphan(const ptc::cluster::Change& change, const std::vector<int>& live) {
  for (int w : change.workers) {
    if (std::binary_search(live.begin(), live.end(), w)) return;
  }
  coordinator_->Withdraw(change, "every participant of the change left the job");
}

void Agent::Recover(const std::vector<int>& live) {
  if (live.empty() || live.front() != options_.worker) return;
  auto current = fs_->store().CurrentSnapshot();
  auto config = ptc::ParseConfig(current->config);
  if (!config.ok()) return;
  std::vector<int> lost;
  for (int w : ptc::cluster::LostWorkers(*config, live)) {
    if (seen_.count(w)) lost.push_back(w);
  }
  // A change this mount still winds down (one that failed on a worker that was dying) first.
  if (lost.empty() || fs_->controller().Busy()) return;
  const std::pair<uint64_t, std::vector<int>> attempt{current->generation, live};
  if (attempt == tried_) return;
  tried_ = attempt;
  std::string names;
  for (int w : lost) names += (names.empty() ? "" : ", ") + std::to_string(w);
  auto to = ptc::cluster::SurvivorConfig(fs_->snapshot()->spec(), *config, live);
  ptc::Status s = to.ok() ? Propose(to->ToString(), *to) : to.status();
  if (s.ok()) recovery_ = Proposed()->id;  // aborted before it applies here (Settle): the mount says failed
  std::fprintf(stderr, "ptcfs: worker %s left the job: %s\n", names.c_str(),
               s.ok() ? ("reconfiguring onto the survivors: " + to->ToString()).c_str() : s.ToString().c_str());
  if (!s.ok()) fs_->controller().RecordError("worker " + names + " left the job; no change onto the survivors: " + s.message());
}

bool Agent::Replicate(const std::vector<int>& live) {
  auto current = fs_->store().CurrentSnapshot();
  if (saved_ != current->generation || live.empty() || live.front() != options_.worker || fs_->controller().Busy()) {
    return false;
  }
  saved_ = 0;
  auto config = ptc::ParseConfig(current->config);
  if (!config.ok() || config->replicas < 2) return false;
  const ptc::Status s = Propose(config->ToString(), *config);
  std::fprintf(
      stderr, "ptcfs: the save of generation %llu committed: %s\n",
      static_cast<unsigned long long>(current->generation),
      s.ok() ? ("copying its pieces to their replicas (replicas=" + std::to_string(config->replicas) + ")").c_str()
             : s.ToString().c_str());
  if (!s.ok()) fs_->controller().RecordError("the save's pieces not copied to their replicas: " + s.message());
  return true;
}

bool Agent::Resume(const std::vector<int>& live) {
  if (resume_config_.empty()) return false;
  if (fs_->store().CurrentSnapshot()->generation != resume_generation_) {  // the job moved on
    resume_config_.clear();
    return false;
  }
  if (live.empty() || live.front() != options_.worker || fs_->controller().Busy()) return false;
  auto config = ptc::ParseConfig(resume_config_);
  if (!config.ok()) {
    resume_config_.clear();
    return false;
  }
  for (int w : config->Workers()) {
    if (!std::binary_search(live.begin(), live.end(), w)) return true;  // wait for it: nothing else first
  }
  const ptc::Status s = Propose(config->ToString(), *config);
  std::fprintf(stderr, "ptcfs: generation %llu restored from the durable tier in the copy's layout: %s\n",
               static_cast<unsigned long long>(resume_generation_),
               s.ok() ? ("back to the job's last layout, " + config->ToString()).c_str() : s.ToString().c_str());
  if (!s.ok()) fs_->controller().RecordError("the job's last layout not resumed after a restore: " + s.message());
  resume_config_.clear();
  return true;
}

void Agent::Compact(const std::vector<int>& live) {
  if (live.empty() || live.front() != options_.worker || fs_->controller().Busy()) return;
  const std::shared_ptr<const Snapshot> served = fs_->snapshot();
  const uint64_t generation = served->generation();
  std::pair<uint64_t, std::vector<int>> look{generation, live};
  if (look == compact_looked_ || generation != fs_->store().current_generation()) return;
  compact_looked_ = std::move(look);
  if (!fs_->controller().CompactionDue(served)) return;
  if (auto pending = coordinator_->Pending(); !pending.ok() || *pending) {  // a recovery proposed just now
    compact_looked_ = {};
    return;
  }
  const bool rank_files = fs_->controller().compaction_policy().rank_files;
  const ptc::cluster::CompactionRequest request{rank_files};
  // Every worker of the config writes its targets: all must take part.
  auto change = ProposeToJob(request, served->config().Workers(), "it is tried again after the next change");
  std::fprintf(stderr, "ptcfs: generation %llu is fragmented past the compaction policy: %s\n",
               static_cast<unsigned long long>(generation),
               change.ok() ? ("every worker compacts its pieces (" + ptc::cluster::EncodeRequest(request) + ")").c_str()
                           : change.status().ToString().c_str());
}

void Agent::NoteWhole(const std::vector<int>& live) {
  auto current = fs_->store().CurrentSnapshot();
  auto config = ptc::ParseConfig(current->config);
  if (!config.ok()) return;
  if (!ptc::cluster::LostWorkers(*config, live).empty()) {
    missing_ = true;
    return;
  }
  if (!missing_ || fs_->controller().Busy()) return;
  missing_ = false;
  fs_->controller().Recovered("every worker of generation " + std::to_string(current->generation) + " is live again");
}

bool Agent::InStep(const ptc::Result<std::optional<ptc::cluster::Change>>& pending) {
  const std::string worker = "worker " + std::to_string(options_.worker);
  if (held_) {
    ptc::Status health = membership_->health();
    if (health.ok() && !Behind(pending)) {
      if (!member_) Resume();
      return true;
    }
    if (health.code() == ptc::Code::kIOError) {
      member_ = false;
      NoteAway(worker + " cannot reach etcd for job " + options_.job + " (" + health.message() +
               "): serving generation " + std::to_string(fs_->store().current_generation()) +
               "; a member again once etcd renews its lease, else it rejoins");
      return false;
    }
    if (health.ok()) {
      (void)membership_->Leave();
      health = ptc::FailedPreconditionError("the job committed a generation without it");
    }
    held_ = false;
    member_ = false;
    away_ = worker + " lost its membership of job " + options_.job + " (" + health.message() + "): rejoining";
    NoteAway(away_);
  }
  // etcd unreachable (the link still cut): no attempt, which would wait on etcd again.
  auto joined = pending.ok() ? Rejoin(rejoin_, fs_->controller(), fs_->store())
                             : ptc::Result<std::unique_ptr<ptc::cluster::Membership>>(pending.status());
  if (!joined.ok()) {
    NoteAway(away_ + ": " + joined.status().message());
    return false;
  }
  membership_ = std::move(*joined);
  held_ = true;
  member_ = true;
  // Workers count as lost once seen live again: the first to rejoin after its
  // link came back would otherwise count the others, whose leases expire too, as lost.
  seen_.clear();
  fs_->controller().RecordError("");  // the loss is over
  std::fprintf(stderr, "ptcfs: %s rejoined job %s at generation %llu\n", worker.c_str(), options_.job.c_str(),
               static_cast<unsigned long long>(fs_->store().current_generation()));
  noted_.clear();
  return true;
}

void Agent::Resume() {
  member_ = true;
  fs_->controller().RecordError("");
  std::fprintf(stderr, "ptcfs: worker %d reaches etcd again, its lease renewed: a member of job %s as before\n",
               options_.worker, options_.job.c_str());
  noted_.clear();
}

bool Agent::Behind(const ptc::Result<std::optional<ptc::cluster::Change>>& pending) {
  if (!pending.ok() || *pending || fs_->controller().Busy()) return false;
  auto committed = coordinator_->GetCommitted();
  return committed.ok() && *committed && (*committed)->generation != fs_->store().current_generation();
}

void Agent::NoteAway(const std::string& message) {
  fs_->controller().RecordError(message);
  if (message == noted_) return;
  noted_ = message;
  std::fprintf(stderr, "ptcfs: %s\n", message.c_str());
}

void Agent::Report(const std::vector<int>& live) {
  auto current = fs_->store().CurrentSnapshot();
  auto key = std::make_pair(current->generation, live);
  if (key == reported_) return;
  reported_ = std::move(key);
  nlohmann::json j = {{"job", options_.job}, {"worker", options_.worker}, {"members", live}};
  auto spec = ptc::SpecFromManifest(*current);
  auto config = ptc::ConfigFromManifest(*current);
  if (spec.ok() && config.ok()) {
    const auto held = PiecesByWorker(*current);
    const auto mine = held.find(options_.worker);
    j.update(PiecesJson(mine == held.end() ? WorkerPieces{} : mine->second));
    j["if_lost"] = IfLost(*current, *spec, *config, live, options_.worker, nullptr);
  }
  ptc::MutexLock lock(&report_mu_);
  report_ = std::move(j);
}

nlohmann::json Agent::StatusPart() const {
  nlohmann::json j;
  {
    ptc::MutexLock lock(&report_mu_);
    j = report_;
  }
  j["member"] = member_.load();
  if (env_ != nullptr) {  // what this worker's store read from the other workers, since the mount
    const ptc::cluster::PeerEnv::Stats pulled = env_->stats();
    j["pulled"] = {{"requests", pulled.requests},
                   {"bytes", pulled.bytes},
                   {"ahead", pulled.ahead},
                   {"connects", pulled.connections.connects},
                   {"reuses", pulled.connections.reuses}};
  }
  if (durable_) j["durable"] = durable_->Report();
  return j;
}

void Agent::Apply(const ptc::cluster::Change& change) {
  if (change.id == applied_ || change.from != fs_->store().CurrentSnapshot()->generation) return;
  const std::set<int> participants(change.workers.begin(), change.workers.end());
  if (!participants.count(options_.worker)) return;
  if (fs_->controller().Busy()) {
    // The previous change winds down: the next look applies this one. A
    // compaction of the job still running lost its change (one at a time): it stops.
    fs_->controller().CancelCompaction();
    return;
  }
  applied_ = change.id;
  auto agreed =
      std::make_shared<AppliedChange>(change, participants, coordinator_, &fs_->store(), env_, options_, &saved_, server_);
  auto request =
      ptc::cluster::DecodeRequest("the change to generation " + std::to_string(change.generation), change.request);
  if (!request.ok()) {
    agreed->Failed(request.status());
    fs_->controller().RecordError(request.status().message());
    return;
  }
  // Every kind enters the mount through its one door (ChangeApplier, fs/participant.h).
  ChangeApplier& door = *fs_;
  std::visit(Overloaded{
                 [&](const ptc::cluster::RelayoutRequest& r) { (void)door.ApplyRelayout(r.config, std::move(agreed)); },
                 [&](const ptc::cluster::SaveRequest& r) { (void)door.ApplySave(r.iteration, std::move(agreed)); },
                 [&](const ptc::cluster::DcpSaveRequest& r) {
                   auto metadata = DcpMetadata(r);
                   if (!metadata.ok()) {
                     agreed->Failed(metadata.status());
                     fs_->controller().RecordError("DCP save " + r.save + ": " + metadata.status().message());
                     return;
                   }
                   (void)door.ApplyDcpSave(r.save, std::move(*metadata), std::move(agreed));
                 },
                 [&](const ptc::cluster::CompactionRequest& r) {
                   (void)door.ApplyCompaction(r.rank_files, std::move(agreed));
                 },
             },
             *request);
}

}  // namespace ptcfs::worker
