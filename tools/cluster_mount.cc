#include "tools/cluster_mount.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "cluster/coordinator.h"
#include "cluster/durable.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/peer_env.h"
#include "cluster/peer_server.h"
#include "cluster/recovery.h"
#include "cluster/rejoin.h"
#include "cluster/token.h"
#include "ptc/base/mutex.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store_layout.h"
#include "tools/cluster_report.h"
#include "tools/cluster_rejoin.h"
#include "tools/durable_keeper.h"

namespace ptcfs {

ptc::Result<ClusterUrl> ParseClusterUrl(std::string_view text) {
  auto bad = [&] {
    return ptc::InvalidArgumentError("--cluster '" + std::string(text) +
                                     "': expected etcd://HOST:PORT[,HOST:PORT...]/JOB");
  };
  constexpr std::string_view kScheme = "etcd://";
  if (!text.starts_with(kScheme)) return bad();
  std::string_view rest = text.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad();
  ClusterUrl url;
  url.job = std::string(rest.substr(slash + 1));
  PTC_RETURN_IF_ERROR(ptc::ValidateJobName(url.job));
  std::string_view hosts = rest.substr(0, slash);
  while (!hosts.empty()) {
    const size_t comma = hosts.find(',');
    std::string_view h = hosts.substr(0, comma);
    if (!ptc::ParsePeerAddress(h).ok()) return bad();
    url.endpoints.emplace_back(h);
    hosts = comma == std::string_view::npos ? std::string_view() : hosts.substr(comma + 1);
  }
  if (url.endpoints.empty()) return bad();
  return url;
}

struct ClusterMount::Impl {
  ClusterArgs args;
  ClusterUrl url;
  int worker = 0;
  std::string token;
  ptc::PeerAddress listen;
  std::unique_ptr<ptc::EtcdClient> etcd;
  std::unique_ptr<ptc::Coordinator> coordinator;
  std::unique_ptr<ptc::PeerEnv> env;
};

namespace {

// The longest the agent sleeps between two looks at etcd (a watch wakes it
// at once when a key of the job changes), and how often it looks when it
// cannot watch. The longest also bounds how long an unmount waits for it.
constexpr std::chrono::milliseconds kFollowEvery{1000};
constexpr std::chrono::milliseconds kPollWithoutWatch{50};


// The running worker: peer server, membership and the agent's thread, which
// follows etcd: the members' addresses, and changes to apply.
class Agent {
 public:
  explicit Agent(Filesystem* fs) : fs_(fs) {}
  ~Agent() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    durable_.reset();
    if (impl_ != nullptr) impl_->env->SetCurrent(nullptr);
    if (membership_) (void)membership_->Leave();
    if (server_) server_->Stop();
  }

  ptc::Status Start(ClusterMount::Impl* impl) {
    impl_ = impl;
    ptc::PeerServerOptions server;
    server.address = impl->listen.host;
    server.port = impl->listen.port;
    server.token = impl->token;
    server.worker = impl->worker;
    PTC_ASSIGN_OR_RETURN(server_, ptc::PeerServer::Start(&fs_->store(), server));
    impl->env->SetCurrent([store = &fs_->store()] { return store->CurrentSnapshot(); });
    PTC_ASSIGN_OR_RETURN(membership_, ptc::Membership::Join(impl->etcd.get(), {impl->url.job, impl->worker,
                                                                               impl->listen.ToString(),
                                                                               impl->args.lease_seconds}));
    rejoin_ = {impl->etcd.get(), impl->coordinator.get(), membership_->options(), {}};
    rejoin_.client.token = impl->token;
    Follow();
    fs_->controller().SetStatusPart([this] { return StatusPart(); });
    fs_->controller().SetPropose(
        [this](const std::string& text, const ptc::ParallelConfig& config) { return Propose(text, config); });
    if (!impl->args.durable.empty()) {
      durable_ = std::make_unique<DurableKeeper>(impl->args.durable, impl->url.job, impl->worker, impl->env.get(), fs_,
                                                 impl->coordinator.get());
    }
    thread_ = std::thread([this] { Loop(); });
    return ptc::Status::OK();
  }

 private:
  // On a FUSE thread, or the agent's (Recover). membership_ is the agent's own: not read here.
  ptc::Status Propose(const std::string& text, const ptc::ParallelConfig& config) {
    if (!member_) {
      return ptc::FailedPreconditionError("worker " + std::to_string(impl_->worker) + " is not a member of job " +
                                          impl_->url.job + " now (etcd out of reach, or it rejoins): " +
                                          "try again once .ptcfs/status shows no error");
    }
    PTC_ASSIGN_OR_RETURN(std::vector<ptc::Member> members, ptc::ListMembers(*impl_->etcd, impl_->url.job));
    std::vector<int> workers;
    for (const ptc::Member& m : members) workers.push_back(m.worker);
    const uint64_t from = fs_->store().CurrentSnapshot()->generation;
    // The request as written to .ptcfs/config, less its line end: it names the change in every worker's messages.
    const std::string request = text.substr(0, text.find_last_not_of(" \t\r\n") + 1);
    PTC_ASSIGN_OR_RETURN(ptc::Change change, impl_->coordinator->Propose(request, from, workers, config.Workers()));
    ptc::MutexLock lock(&proposed_mu_);
    proposed_ = std::move(change);
    return ptc::Status::OK();
  }

  // The change this mount proposed, until its agent applied it or saw it end.
  std::optional<ptc::Change> Proposed() EXCLUDES(proposed_mu_) {
    ptc::MutexLock lock(&proposed_mu_);
    return proposed_;
  }

  // The change this mount proposed (`asked`, read before `pending`) is over
  // for the agent once applied; one the job no longer has that it never
  // applied was aborted first (another participant failed at once): the
  // mount's state says so (Controller::EndProposal).
  void Settle(const ptc::Change& asked, const ptc::Result<std::optional<ptc::Change>>& pending) {
    if (asked.id != applied_) {
      if (!pending.ok() || (*pending && (*pending)->id == asked.id)) return;
      fs_->controller().EndProposal(impl_->coordinator->Aborted(asked));
    }
    ptc::MutexLock lock(&proposed_mu_);
    if (proposed_ && proposed_->id == asked.id) proposed_.reset();
  }

  // The members' addresses and the generations served, into the env and the
  // server; `live` gets the live workers, sorted. Returns etcd's revision of
  // the members read (0 when it failed, and `live` is left empty).
  int64_t Follow(std::vector<int>* live = nullptr) {
    int64_t revision = 0;
    auto members = membership_->Members(&revision);
    if (!members.ok()) revision = 0;
    if (members.ok()) {
      std::map<int, ptc::PeerAddress> peers;
      for (const ptc::Member& m : *members) {
        if (auto a = ptc::ParsePeerAddress(m.address); a.ok()) peers[m.worker] = *a;
        if (live != nullptr) live->push_back(m.worker);
      }
      impl_->env->SetPeers(std::move(peers));
    }
    auto current = fs_->store().CurrentSnapshot();
    if (current != served_.front()) {
      served_ = {current, served_.front()};  // the previous one: readers of older files
      impl_->env->SetManifests(served_);
      server_->SetKeptGenerations({served_[1]});
    }
    return revision;
  }

  // Reads the members and the change under way, then sleeps until etcd holds
  // something newer (a watch of the job's keys), at most kFollowEvery: a
  // commit by this mount's own rewrite changes no key, and the generations
  // served follow the store.
  void Loop() {
    while (!stop_) {
      std::vector<int> live;
      const int64_t revision = Follow(&live);
      seen_.insert(live.begin(), live.end());
      const std::optional<ptc::Change> asked = Proposed();  // before Pending: a change it names is in etcd
      auto pending = impl_->coordinator->Pending();
      if (pending.ok() && *pending && revision > 0) WithdrawOrphan(**pending, live);
      const bool member = InStep(pending);  // a worker that rejoins neither applies, recovers nor copies
      if (member && pending.ok() && *pending) Apply(**pending);
      if (asked) Settle(*asked, pending);
      if (member && pending.ok() && !*pending && revision > 0) Recover(live);
      if (member && pending.ok() && !*pending && durable_) durable_->Look();
      if (revision > 0) Report(live);
      if (stop_) break;
      if (revision > 0 && impl_->etcd->WaitForChange(ptc::JobPrefix(impl_->url.job), revision, kFollowEvery).ok()) {
        continue;
      }
      std::this_thread::sleep_for(kPollWithoutWatch);
    }
  }

  // A change none of whose participants is live (all died or were cut off
  // while it ran) has no one left to abort it: any worker withdraws it.
  void WithdrawOrphan(const ptc::Change& change, const std::vector<int>& live) {
    for (int w : change.workers) {
      if (std::binary_search(live.begin(), live.end(), w)) return;
    }
    impl_->coordinator->Withdraw(change, "every participant of the change left the job");
  }

  // When workers of the committed config have left the job (their leases
  // expired after this agent saw them live), the lowest live worker proposes
  // the survivors' config (SurvivorConfig): the change then runs as any
  // other, sourcing the lost workers' pieces from their replicas. Once per
  // (generation, live members): a change that cannot run (pieces on no live
  // worker) fails, naming them, and is not retried until either changes.
  void Recover(const std::vector<int>& live) {
    if (live.empty() || live.front() != impl_->worker) return;
    auto current = fs_->store().CurrentSnapshot();
    auto config = ptc::ParseConfig(current->config);
    if (!config.ok()) return;
    std::vector<int> lost;
    for (int w : ptc::LostWorkers(*config, live)) {
      if (seen_.count(w)) lost.push_back(w);
    }
    // A change this mount still winds down (one that failed on a worker that was dying) first.
    if (lost.empty() || fs_->controller().Busy()) return;
    const std::pair<uint64_t, std::vector<int>> attempt{current->generation, live};
    if (attempt == tried_) return;
    tried_ = attempt;
    std::string names;
    for (int w : lost) names += (names.empty() ? "" : ", ") + std::to_string(w);
    auto to = ptc::SurvivorConfig(fs_->snapshot()->spec(), *config, live);
    ptc::Status s = to.ok() ? Propose(to->ToString(), *to) : to.status();
    std::fprintf(stderr, "ptcfs: worker %s left the job: %s\n", names.c_str(),
                 s.ok() ? ("reconfiguring onto the survivors: " + to->ToString()).c_str() : s.ToString().c_str());
    if (!s.ok()) fs_->controller().RecordError("worker " + names + " left the job; no change onto the survivors: " + s.message());
  }

  // Whether this worker is a member of the job in step with it. While no
  // renewal of its lease succeeds (etcd, or the link to it, away for a whole
  // lease) it is not sure: .ptcfs/status and stderr say so, it serves what it
  // has and goes on renewing; an etcd that starts again renews every lease,
  // and it is a member as before. One whose lease was lost (its link was cut
  // longer than the lease), or that a change committed without (a race with a
  // recovery as it rejoined), stops being one: status and stderr say so, and
  // it rejoins (Rejoin, cluster_rejoin.h) on a later look, once etcd answers.
  bool InStep(const ptc::Result<std::optional<ptc::Change>>& pending) {
    const std::string worker = "worker " + std::to_string(impl_->worker);
    if (held_) {
      ptc::Status health = membership_->health();
      if (health.ok() && !Behind(pending)) {
        if (!member_) Resume();
        return true;
      }
      if (health.code() == ptc::Code::kIOError) {
        member_ = false;
        NoteAway(worker + " cannot reach etcd for job " + impl_->url.job + " (" + health.message() +
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
      away_ = worker + " lost its membership of job " + impl_->url.job + " (" + health.message() + "): rejoining";
      NoteAway(away_);
    }
    // etcd unreachable (the link still cut): no attempt, which would wait on etcd again.
    auto joined = pending.ok() ? Rejoin(rejoin_, fs_->controller(), fs_->store())
                               : ptc::Result<std::unique_ptr<ptc::Membership>>(pending.status());
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
    std::fprintf(stderr, "ptcfs: %s rejoined job %s at generation %llu\n", worker.c_str(), impl_->url.job.c_str(),
                 static_cast<unsigned long long>(fs_->store().current_generation()));
    noted_.clear();
    return true;
  }

  // etcd renewed the lease again (it was away, then started again): the
  // worker is a member as it was, nothing was lost.
  void Resume() {
    member_ = true;
    fs_->controller().RecordError("");
    std::fprintf(stderr, "ptcfs: worker %d reaches etcd again, its lease renewed: a member of job %s as before\n",
                 impl_->worker, impl_->url.job.c_str());
    noted_.clear();
  }

  // Whether a change committed without this member while it was not busy
  // (only the agent's thread starts changes: its own are over).
  bool Behind(const ptc::Result<std::optional<ptc::Change>>& pending) {
    if (!pending.ok() || *pending || fs_->controller().Busy()) return false;
    auto committed = impl_->coordinator->GetCommitted();
    return committed.ok() && *committed && (*committed)->generation != fs_->store().current_generation();
  }

  // Keeps `message` as last_error and logs it when it changed.
  void NoteAway(const std::string& message) {
    fs_->controller().RecordError(message);
    if (message == noted_) return;
    noted_ = message;
    std::fprintf(stderr, "ptcfs: %s\n", message.c_str());
  }

  // The "cluster" part of .ptcfs/status (docs/mount_format.md): this
  // worker's view of its job, made again when the generation or the live
  // members change (a plan per look would be too slow for a large model).
  void Report(const std::vector<int>& live) {
    auto current = fs_->store().CurrentSnapshot();
    auto key = std::make_pair(current->generation, live);
    if (key == reported_) return;
    reported_ = std::move(key);
    nlohmann::json j = {{"job", impl_->url.job}, {"worker", impl_->worker}, {"members", live}};
    auto spec = ptc::SpecFromManifest(*current);
    auto config = ptc::ConfigFromManifest(*current);
    if (spec.ok() && config.ok()) {
      const auto held = PiecesByWorker(*current);
      const auto mine = held.find(impl_->worker);
      j.update(PiecesJson(mine == held.end() ? WorkerPieces{} : mine->second));
      j["if_lost"] = IfLost(*current, *spec, *config, live, impl_->worker, nullptr);
    }
    ptc::MutexLock lock(&report_mu_);
    report_ = std::move(j);
  }

  nlohmann::json StatusPart() EXCLUDES(report_mu_) {
    nlohmann::json j;
    {
      ptc::MutexLock lock(&report_mu_);
      j = report_;
    }
    j["member"] = member_.load();
    return j;
  }

  void Apply(const ptc::Change& change) {
    if (change.id == applied_ || change.from != fs_->store().CurrentSnapshot()->generation) return;
    const std::set<int> participants(change.workers.begin(), change.workers.end());
    if (!participants.count(impl_->worker)) return;
    if (fs_->controller().Busy()) return;  // the previous change winds down: the next look applies this one
    applied_ = change.id;
    ClusterChange cc;
    cc.participants = participants;
    const ptc::Coordinator* coordinator = impl_->coordinator.get();
    const ptc::Store* store = &fs_->store();
    cc.before_commit = [change, coordinator, store](ptc::GenerationWriter& writer,
                                                    const std::string& config) -> ptc::Status {
      // The part is durable before the job may count on it.
      PTC_RETURN_IF_ERROR(store->env()->SyncFileSystem(store->root()));
      const std::string prefix = ptc::GenerationDirName(writer.generation()) + "/";
      std::vector<ptc::ShardRecord> written, referenced;
      for (ptc::ShardRecord& s : writer.Shards()) (s.file.starts_with(prefix) ? written : referenced).push_back(s);
      PTC_ASSIGN_OR_RETURN(std::vector<ptc::ShardRecord> others,
                           coordinator->Finish(change, config, written, referenced,
                                               store->CurrentSnapshot()->tensors));
      for (ptc::ShardRecord& s : others) writer.AddShard(std::move(s));
      return ptc::Status::OK();
    };
    cc.failed = [change, coordinator](const ptc::Status& s) { coordinator->Fail(change, s); };
    if (!impl_->args.durable.empty()) {
      cc.last_resort = [dir = impl_->args.durable, job = impl_->url.job, coordinator, store,
                        env = impl_->env.get()]() -> ptc::Result<std::vector<ptc::ShardRecord>> {
        PTC_ASSIGN_OR_RETURN(std::optional<ptc::Committed> committed, coordinator->GetCommitted());
        if (!committed) return ptc::FailedPreconditionError("the job has no committed generation");
        return ptc::LoadDurable(env, dir, {job, committed->contents}, store->CurrentSnapshot()->tensors);
      };
    }
    (void)fs_->controller().Apply(change.request, fs_->snapshot(), std::move(cc));
  }

  Filesystem* const fs_;
  ClusterMount::Impl* impl_ = nullptr;
  std::unique_ptr<ptc::PeerServer> server_;
  std::unique_ptr<ptc::Membership> membership_;  // replaced when it rejoins (the loop's own after Start)
  bool held_ = true;                            // membership_ may still be renewed (the loop's own)
  std::atomic<bool> member_{true};              // membership_ is renewed and in step with the job
  RejoinTarget rejoin_;                         // how it joins again (set by Start)
  std::string away_, noted_;                    // what status says while it rejoins (the loop's own)
  std::vector<std::shared_ptr<const ptc::GenerationManifest>> served_ = {nullptr, nullptr};
  std::string applied_;  // the id of the last change applied (the loop's own)
  ptc::Mutex proposed_mu_;
  std::optional<ptc::Change> proposed_ GUARDED_BY(proposed_mu_);  // see Settle
  std::set<int> seen_;   // workers seen live since the mount started or rejoined (the loop's own)
  std::pair<uint64_t, std::vector<int>> tried_;  // the last recovery proposed (the loop's own)
  std::unique_ptr<DurableKeeper> durable_;  // with --durable
  std::pair<uint64_t, std::vector<int>> reported_;  // what report_ was made for (the loop's own)
  ptc::Mutex report_mu_;
  nlohmann::json report_ GUARDED_BY(report_mu_) = nlohmann::json::object();
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

ClusterMount::ClusterMount(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterMount::~ClusterMount() = default;

ptc::Env* ClusterMount::env() { return impl_->env.get(); }

ptc::Result<std::unique_ptr<ClusterMount>> ClusterMount::Prepare(const ClusterArgs& args, const std::string& store,
                                                                 int worker) {
  auto impl = std::make_unique<Impl>();
  impl->args = args;
  impl->worker = worker;
  if (worker < 0) return ptc::InvalidArgumentError("--cluster needs --worker: this mount's worker id");
  PTC_ASSIGN_OR_RETURN(impl->url, ParseClusterUrl(args.url));
  PTC_ASSIGN_OR_RETURN(impl->listen, ptc::ParsePeerAddress(args.listen), "--listen");
  if (impl->listen.host == "0.0.0.0" || impl->listen.host == "::") {
    return ptc::InvalidArgumentError("--listen " + args.listen +
                                     ": give the address the other workers reach this one at, not a wildcard");
  }
  if (!args.durable.empty()) {
    // The daemon changes its directory: the tier's path is kept whole.
    impl->args.durable = std::filesystem::absolute(args.durable).lexically_normal().string();
    PTC_RETURN_IF_ERROR(ptc::Env::Default()->CreateDirs(impl->args.durable), "--durable");
  }
  if (args.token_file.empty()) return ptc::InvalidArgumentError("--cluster needs --token-file: the job's shared token");
  PTC_ASSIGN_OR_RETURN(impl->token, ptc::ReadTokenFile(args.token_file));
  ptc::EtcdOptions etcd;
  etcd.endpoints = impl->url.endpoints;
  PTC_ASSIGN_OR_RETURN(impl->etcd, ptc::EtcdClient::Create(etcd));
  PTC_RETURN_IF_ERROR(impl->etcd->Health(), "--cluster " + args.url);
  ptc::CoordinatorOptions c;
  c.job = impl->url.job;
  c.worker = worker;
  c.timeout = std::chrono::seconds(args.timeout_seconds);
  impl->coordinator = std::make_unique<ptc::Coordinator>(impl->etcd.get(), c);
  ptc::PeerEnvOptions env;
  env.self = worker;
  env.client.token = impl->token;
  env.durable_dir = impl->args.durable;
  impl->env = std::make_unique<ptc::PeerEnv>(ptc::Env::Default(), store, env);
  // An empty directory is a store to be: a worker that joins with a new disk.
  auto opened = ptc::Store::Open(impl->env.get(), store);
  if (!opened.ok() && opened.status().code() == ptc::Code::kNotFound) opened = ptc::Store::Create(impl->env.get(), store);
  PTC_RETURN_IF_ERROR(opened.status());
  ptc::Store& s = **opened;
  // A worker that was away while the job moved on takes the committed generation from a peer first.
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::Committed> job, impl->coordinator->GetCommitted());
  if (job && !ptc::AtCommitted(s, *job)) {
    PTC_RETURN_IF_ERROR(ptc::CatchUp(*impl->etcd, impl->url.job, worker, *job, ptc::PeerClient(env.client), s));
    std::fprintf(stderr, "ptcfs: worker %d: the store is now at the job's generation %llu (from a peer)\n", worker,
                 static_cast<unsigned long long>(job->generation));
  }
  if (!s.has_generation()) {
    return ptc::FailedPreconditionError(store + ": the store holds no generation, and job " + impl->url.job +
                                        " has none committed yet (import into one worker's store first)");
  }
  PTC_RETURN_IF_ERROR(impl->coordinator->Join(s.current()));
  impl->env->SetManifests({s.CurrentSnapshot()});
  return std::unique_ptr<ClusterMount>(new ClusterMount(std::move(impl)));
}

ptc::Result<std::shared_ptr<void>> ClusterMount::Attach(Filesystem& fs) {
  auto agent = std::make_shared<Agent>(&fs);
  PTC_RETURN_IF_ERROR(agent->Start(impl_.get()));
  return std::shared_ptr<void>(agent);
}

}  // namespace ptcfs
