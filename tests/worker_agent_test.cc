// The worker layer (worker/) without root or etcd: three workers of one job,
// each an in-process file system (fs/) over its own store directory, joined
// by an in-memory key-value store (cluster/mem_kv_store.h) with faults
// injected on demand, and by their peer servers on loopback. The scenarios of
// the netns suites (tests/cluster/), with the same outcomes: a change, a
// worker lost mid-change, a recovery onto the survivors, a rejoin after a
// lease loss, the store away and back, a change whose participants all left,
// a compaction of the job (and a reconfigure, a save, a failure meanwhile).
// After each committed change every rank's files, read through the worker
// its slot names, equal synth of the committed config, tensor by tensor.
//
// The stores live in temporary directories, not in memory Envs: HDF5 opens
// shard files through the OS.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "cluster/coordinator.h"
#include "cluster/job_state.h"
#include "cluster/mem_kv_store.h"
#include "cluster/membership.h"
#include "fs/filesystem.h"
#include "kv_conformance.h"
#include "net_util.h"
#include "ptc/checkpoint/diff.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "test_util.h"
#include "worker/worker.h"

namespace ptcfs::worker {
namespace {

using ptc::Code;
using ptc::testing::Eventually;
using ptc::testing::TempDir;

constexpr char kJob[] = "agents";
constexpr char kDims[] = "layers=6,hidden=32,heads=4,kv_heads=2,vocab=64,seq=8,ffn=48";
constexpr uint64_t kSeed = 7;
constexpr int kWorkers = 3;
constexpr auto kLong = std::chrono::seconds(60);

// The worker's Env with a gate: SyncFileSystem (a part made durable before
// the job may count on it, and a commit) waits while `hold` says so, which
// holds a worker back before it publishes its part of a change, and fails
// when `fail` says so (its disk gone).
class GateEnv final : public ptc::Env {
 public:
  GateEnv(ptc::Env* base, std::function<bool()> hold, std::function<bool()> fail)
      : base_(base), hold_(std::move(hold)), fail_(std::move(fail)) {}
  ptc::Result<std::unique_ptr<ptc::RandomAccessFile>> OpenRead(const std::string& p) override {
    return base_->OpenRead(p);
  }
  ptc::Result<std::unique_ptr<ptc::WritableFile>> OpenWrite(const std::string& p) override {
    return base_->OpenWrite(p);
  }
  ptc::Result<std::unique_ptr<ptc::WritableFile>> OpenExisting(const std::string& p) override {
    return base_->OpenExisting(p);
  }
  bool Exists(const std::string& p) override { return base_->Exists(p); }
  bool Reachable(const std::string& p) override { return base_->Reachable(p); }
  ptc::Result<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  ptc::Result<std::vector<std::string>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  ptc::Status CreateDirs(const std::string& p) override { return base_->CreateDirs(p); }
  ptc::Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  ptc::Status Link(const std::string& from, const std::string& to) override { return base_->Link(from, to); }
  ptc::Status Remove(const std::string& p) override { return base_->Remove(p); }
  ptc::Status RemoveTree(const std::string& p) override { return base_->RemoveTree(p); }
  ptc::Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  ptc::Status SyncFileSystem(const std::string& p) override {
    while (hold_()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (fail_()) return ptc::IOError(p + ": syncfs failed (injected)");
    return base_->SyncFileSystem(p);
  }
  bool IsDirectory(const std::string& p) override { return base_->IsDirectory(p); }
  ptc::Result<std::unique_ptr<ptc::OutputDir>> OpenOutputDir(const std::string& p) override {
    return base_->OpenOutputDir(p);
  }
  uint64_t MemoryBytes() override { return base_->MemoryBytes(); }

 private:
  ptc::Env* const base_;
  const std::function<bool()> hold_, fail_;
};

// One worker: its link to the key-value store, the Worker, its mounted file
// system (in process) over its gated Env, and its agent.
struct Node {
  ptc::cluster::MemKvClient* link = nullptr;  // owned by `worker`
  std::unique_ptr<Worker> worker;
  std::unique_ptr<GateEnv> env;
  std::unique_ptr<Filesystem> fs;
  std::shared_ptr<void> agent;
  void Stop() {
    agent.reset();
    fs.reset();
    env.reset();
    worker.reset();
    link = nullptr;
  }
};

class WorkerAgentTest : public ::testing::Test {
 protected:
  // The job at generation 1: tp=2,pp=3 over workers 0-2 (one stage each), each
  // store holding the manifests and its own worker's shards only.
  void SetUp() override {
    spec_ = ptc::testing::Spec("llama", kDims, ptc::DType::kF32, /*optimizer=*/true);
    const ptc::ParallelConfig start = *ptc::ParseConfig("tp=2,pp=3,per_worker=2");
    ASSERT_TRUE(
        ptc::WriteSynthCheckpoint(ptc::Env::Default(), ptc::testing::FitLayout(spec_, start), kSeed, tmp_ / "src")
            .ok());
    auto imported =
        ptc::ImportCheckpoint(ptc::Env::Default(), tmp_ / "src", tmp_ / "whole", spec_.schema, spec_.dims, start);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    for (int w = 0; w < kWorkers; ++w) {
      const std::string store = Store(w);
      std::filesystem::copy(tmp_ / "whole", store, std::filesystem::copy_options::recursive);
      char mine[16];
      std::snprintf(mine, sizeof(mine), "worker-%02d", w);
      for (const auto& gen : std::filesystem::directory_iterator(store)) {
        if (!gen.is_directory() || !gen.path().filename().string().starts_with("gen-")) continue;
        for (const auto& d : std::filesystem::directory_iterator(gen.path())) {
          const std::string name = d.path().filename().string();
          if (name.starts_with("worker-") && name != mine) std::filesystem::remove_all(d.path());
        }
      }
    }
    admin_ = kv_.Connect();
    for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(Start(w).ok());
  }

  void TearDown() override {
    for (Node& n : nodes_) n.Stop();
    saved_at_.reset();
  }

  std::string Store(int w) const { return tmp_ / ("store" + std::to_string(w)); }

  // Prepares, mounts (in process) and attaches worker w.
  ptc::Status Start(int w) {
    WorkerOptions o;
    o.job = kJob;
    o.worker = w;
    o.listen = {"127.0.0.1", ptc::testing::FreePort()};
    o.token = "agents-token-0123456789";
    o.lease_seconds = 1;
    o.timeout = std::chrono::seconds(30);
    o.durable = durable_;
    auto link = kv_.Connect();
    ptc::cluster::MemKvClient* raw = link.get();
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Prepare(o, std::move(link), Store(w)));
    // Held (held_) or failing (failing_) while its compaction of the job runs;
    // held while it lags (Lagging).
    auto compacting = [this, w] { return Status(w)["compaction"]["state"] == "running"; };
    auto env = std::make_unique<GateEnv>(
        worker->env(), [this, w, compacting] { return (held_[w] && compacting()) || Lagging(w); },
        [this, w, compacting] { return failing_[w] && compacting(); });
    MountOptions m;
    m.store = Store(w);
    m.worker = w;
    m.npy = false;
    m.megatron = true;
    m.env = env.get();
    m.in_cluster = true;
    m.compaction = policy_;
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<Filesystem> fs, Filesystem::Create(m));
    PTC_ASSIGN_OR_RETURN(std::shared_ptr<void> agent, worker->Attach(*fs));
    if (nodes_.size() <= static_cast<size_t>(w)) nodes_.resize(w + 1);
    nodes_[w] = {raw, std::move(worker), std::move(env), std::move(fs), std::move(agent)};
    return ptc::Status::OK();
  }

  // As kill -9: the worker's link is cut (it renews nothing, answers
  // nothing), it stops, and its lease expires.
  void Kill(int w) {
    const int64_t lease = LeaseOf(w);
    nodes_[w].link->Cut(true);
    nodes_[w].Stop();
    EXPECT_TRUE(kv_.ExpireLease(lease)) << "worker " << w;
  }

  int64_t LeaseOf(int w) {
    auto kv = admin_->Get(ptc::cluster::MemberKey(kJob, w));
    EXPECT_TRUE(kv.ok() && kv->has_value()) << "worker " << w << " is no member";
    return kv.ok() && kv->has_value() ? (*kv)->lease : 0;
  }

  nlohmann::json Status(int w) {
    Filesystem& fs = *nodes_[w].fs;
    return nlohmann::json::parse(fs.controller().StatusJson(fs.snapshot()));
  }

  ptc::Status Reconfigure(int w, const std::string& config) {
    Filesystem& fs = *nodes_[w].fs;
    return fs.controller().Reconfigure(config + "\n", fs.snapshot());
  }

  // Every worker in `workers` serves `generation`, and the job committed it.
  bool AtGeneration(const std::vector<int>& workers, uint64_t generation) {
    auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
    if (!committed.ok() || !*committed || (*committed)->generation != generation) return false;
    for (int w : workers) {
      if (nodes_[w].fs->snapshot()->generation() != generation || Status(w)["state"] != "serving") return false;
    }
    return true;
  }

  // Waits for AtGeneration; on a timeout the workers' states say why.
  void ExpectGeneration(const std::vector<int>& workers, uint64_t generation) {
    const bool reached = Eventually([&] { return AtGeneration(workers, generation); }, kLong);
    std::string states;
    for (int w : workers) states += "\nworker " + std::to_string(w) + ": " + Status(w).dump();
    ASSERT_TRUE(reached) << "generation " << generation << " not served by every worker:" << states;
  }

  // The whole content of `path` (under the mount's root) on worker w.
  std::string ReadFile(int w, const std::string& path) { return ReadFile(*nodes_[w].fs, path); }
  std::string ReadFile(Filesystem& fs, const std::string& path) {
    uint64_t ino = kRootInode;
    for (const auto& part : std::filesystem::path(path)) {
      auto e = fs.Lookup(ino, part.string());
      EXPECT_TRUE(e.ok()) << path << ": " << e.status().ToString();
      if (!e.ok()) return "";
      ino = e->ino;
    }
    auto open = fs.Open(ino, O_RDONLY);
    EXPECT_TRUE(open.ok()) << open.status().ToString();
    if (!open.ok()) return "";
    std::string data;
    for (;;) {
      auto r = fs.Read(open->fh, data.size(), 1 << 20);
      EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
      if (!r.ok()) break;
      if (r->fd_range.fd >= 0) {
        std::string chunk(r->fd_length, '\0');
        EXPECT_EQ(pread(r->fd_range.fd, chunk.data(), chunk.size(), r->fd_range.position),
                  static_cast<ssize_t>(chunk.size()));
        data += chunk;
      } else if (r->bytes.empty()) {
        break;
      } else {
        data.append(r->bytes.data(), r->bytes.size());
      }
    }
    fs.Release(open->fh);
    return data;
  }

  // Writes `data` to `path` (under the mount's root) on worker w as a
  // framework does: missing directories made, the file created, written and
  // closed. Returns the close's outcome (a save's latest file commits it).
  ptc::Status WriteFile(int w, const std::string& path, const std::string& data) {
    Filesystem& fs = *nodes_[w].fs;
    uint64_t ino = kRootInode;
    const std::filesystem::path p(path);
    for (const auto& part : p.parent_path()) {
      auto e = fs.Lookup(ino, part.string());
      if (!e.ok()) e = fs.Mkdir(ino, part.string());
      PTC_RETURN_IF_ERROR(e.status());
      ino = e->ino;
    }
    uint64_t fh = 0;
    if (auto e = fs.Lookup(ino, p.filename().string()); e.ok()) {
      PTC_ASSIGN_OR_RETURN(OpenReply open, fs.Open(e->ino, O_WRONLY | O_TRUNC));
      fh = open.fh;
    } else {
      PTC_ASSIGN_OR_RETURN(auto created, fs.Create(ino, p.filename().string(), O_WRONLY | O_CREAT | O_TRUNC));
      fh = created.second.fh;
    }
    auto n = fs.Write(fh, data.data(), data.size(), 0);
    ptc::Status s = n.ok() ? fs.Flush(fh) : n.status();
    fs.Release(fh);
    return s;
  }

  // The job's ranks as Megatron renders them at iteration `iteration` (the
  // same tensors): a copy of the job's store with a generation over the same
  // shards whose Megatron state says that iteration, mounted alone (in
  // process). What a framework that trained on would save then.
  Filesystem& SavedAt(uint64_t iteration) {
    const std::string dir = tmp_ / ("at-" + std::to_string(iteration));
    if (!saved_at_) {
      std::filesystem::copy(tmp_ / "whole", dir, std::filesystem::copy_options::recursive);
      auto store = ptc::Store::Open(ptc::Env::Default(), dir);
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      auto writer = (*store)->BeginGeneration();
      EXPECT_TRUE(writer.ok()) << writer.status().ToString();
      ptc::GenerationManifest meta = (*store)->current();
      for (const ptc::ShardRecord& s : meta.shards) (*writer)->AddShard(s);
      ptc::megatron::MegatronState state;
      state.iteration = iteration;
      meta.extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(state);
      const ptc::Status committed = (*writer)->Commit(std::move(meta));
      EXPECT_TRUE(committed.ok()) << committed.ToString();
      MountOptions m;
      m.store = dir;
      m.megatron = true;
      auto fs = Filesystem::Create(m);
      EXPECT_TRUE(fs.ok()) << fs.status().ToString();
      saved_at_ = std::move(fs).value();
    }
    return *saved_at_;
  }

  // Worker w's Megatron rank files of pp stage w (ranks 2w, 2w + 1 of
  // tp=2,pp=3), saved as iteration `iteration` (SavedAt) through its mount
  // (no latest file).
  void SaveOwnRanks(int w, uint64_t iteration) {
    for (int tp = 0; tp < 2; ++tp) {
      const std::string file = "megatron/" + ptc::megatron::IterationDirName(iteration) + "/" +
                               ptc::megatron::RankDirName(tp, w, 3) + "/" + std::string(ptc::megatron::kRankFile);
      const std::string bytes = ReadFile(SavedAt(iteration), file);
      ASSERT_FALSE(bytes.empty()) << file;
      const ptc::Status s = WriteFile(w, file, bytes);
      ASSERT_TRUE(s.ok()) << file << " on worker " << w << ": " << s.ToString();
    }
  }

  // Writes the latest file naming `iteration` on worker w: the save's commit.
  ptc::Status CommitSave(int w, uint64_t iteration) {
    return WriteFile(w, "megatron/" + std::string(ptc::megatron::kLatestFile), std::to_string(iteration));
  }

  // Every rank of the committed config, read through the worker its slot
  // names, equals synth of that config (ptcfs diff's comparison).
  void ExpectRanksEqualSynth() {
    auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
    ASSERT_TRUE(committed.ok() && *committed);
    const std::string text = (*committed)->config;
    auto config = ptc::ParseConfig(text);
    ASSERT_TRUE(config.ok()) << text;
    const std::string tag = std::to_string((*committed)->generation);
    const std::string ref = tmp_ / ("ref-" + tag), joined = tmp_ / ("joined-" + tag);
    ASSERT_TRUE(
        ptc::WriteSynthCheckpoint(ptc::Env::Default(), ptc::testing::FitLayout(spec_, *config), kSeed, ref).ok());
    for (int r = 0; r < config->world_size(); ++r) {
      char rank[32];
      std::snprintf(rank, sizeof(rank), "rank-%05d", r);
      const int w = config->WorkerOf(r);
      ASSERT_TRUE(w < static_cast<int>(nodes_.size()) && nodes_[w].fs) << rank << " is on worker " << w << ", not up";
      std::filesystem::create_directories(joined + "/" + rank);
      for (const std::string file : {"model.safetensors", "optim.safetensors"}) {
        ptc::testing::Spit(joined + "/" + rank + "/" + file, ReadFile(w, std::string("model/") + rank + "/" + file));
      }
    }
    auto diff = ptc::DiffCheckpoints(ptc::Env::Default(), spec_.schema, spec_.dims, {ref, *config}, {joined, *config});
    ASSERT_TRUE(diff.ok()) << diff.status().ToString();
    EXPECT_TRUE(diff->equal) << text << ": " << diff->reason;
  }

  // What is committed now.
  ptc::cluster::Committed Committed() {
    auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
    EXPECT_TRUE(committed.ok() && *committed);
    return committed.ok() && *committed ? **committed : ptc::cluster::Committed{};
  }

  // Whether worker w is the lagging one (lagging_) and the job committed
  // generation lag_at_ while w has not yet: its local commit of it waits.
  bool Lagging(int w) {
    if (w != lagging_ || lag_at_ == 0) return false;
    auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
    return committed.ok() && *committed && (*committed)->generation >= lag_at_ &&
           nodes_[w].fs->snapshot()->generation() < lag_at_;
  }

  CompactionPolicy policy_;                   // the workers' (set before SetUp)
  std::atomic<int> lagging_{-1};              // the worker Lagging holds back
  std::atomic<uint64_t> lag_at_{0};           // the generation it is slow to commit (0: none)
  ptc::cluster::DurableLocation durable_;     // the workers' durable tier from their next Start; none by default
  std::atomic<bool> held_[kWorkers] = {};     // worker w holds back its part of a compaction (GateEnv)
  std::atomic<bool> failing_[kWorkers] = {};  // worker w's part of a compaction fails (GateEnv)
  TempDir tmp_;
  ptc::ModelSpec spec_;
  ptc::cluster::MemKv kv_;
  std::unique_ptr<ptc::cluster::MemKvClient> admin_;  // the test's own link
  std::vector<Node> nodes_;
  std::unique_ptr<Filesystem> saved_at_;  // SavedAt's
};

TEST_F(WorkerAgentTest, AChangeOnOneMountIsCommittedByEvery) {
  ASSERT_TRUE(Reconfigure(1, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  EXPECT_EQ(nodes_[0].fs->snapshot()->generation(), 2u);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(Status(w)["cluster"]["members"], nlohmann::json({0, 1, 2})) << Status(w).dump();
    EXPECT_EQ(Status(w)["cluster"]["member"], true);
  }
  ExpectRanksEqualSynth();
}

// A worker dies while a change runs: the change is aborted on every worker,
// nothing committed; the survivors then move onto themselves, the lost
// stage read from its replica.
TEST_F(WorkerAgentTest, AWorkerLostMidChangeAbortsItAndTheSurvivorsRecover) {
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  nodes_[2].link->Cut(true);  // dying: it sees the change no more
  ASSERT_TRUE(Reconfigure(0, "tp=1,pp=6,per_worker=2,replicas=2").ok());
  ASSERT_TRUE(Eventually([&] { return admin_->Get(ptc::cluster::PartKey(kJob, 3, 0))->has_value(); }, kLong))
      << "worker 0 never published its part: " << Status(0).dump();
  Kill(2);
  ExpectGeneration({0, 1}, 3);
  // The change to tp=1,pp=6 committed nowhere; the survivors' config did.
  auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
  ASSERT_TRUE(committed.ok() && *committed);
  EXPECT_EQ((*committed)->config.find("pp=6"), std::string::npos) << (*committed)->config;
  EXPECT_EQ(ptc::ParseConfig((*committed)->config)->Workers(), std::vector<int>({0, 1}));
  ExpectRanksEqualSynth();
}

// A worker whose lease expired while its link was cut (the job recovered
// without it) rejoins by itself once the link is back: it catches up with
// the committed generation from a peer, then joins; a change brings it back
// into the layout.
TEST_F(WorkerAgentTest, AWorkerRejoinsAfterItsLeaseWasLost) {
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  const int64_t lease = LeaseOf(2);
  nodes_[2].link->Cut(true);
  ASSERT_TRUE(kv_.ExpireLease(lease));
  ExpectGeneration({0, 1}, 3);                            // the survivors' config
  EXPECT_EQ(nodes_[2].fs->snapshot()->generation(), 2u);  // it serves what it has meanwhile
  nodes_[2].link->Cut(false);
  ASSERT_TRUE(Eventually([&] { return AtGeneration({2}, 3) && Status(2)["cluster"]["member"] == true; }, kLong))
      << Status(2).dump();
  EXPECT_NE(LeaseOf(2), lease);  // a new lease
  ASSERT_TRUE(Reconfigure(2, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 4);
  ExpectRanksEqualSynth();
}

// The key-value store away for longer than a lease: every worker says so and
// refuses changes, serving what it has; back, the leases renew and a change
// commits as before.
TEST_F(WorkerAgentTest, TheStoreAwayAndBack) {
  kv_.SetReachable(false);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(Eventually(
        [&] { return Status(w)["last_error"].dump().find("cannot reach etcd") != std::string::npos; }, kLong))
        << Status(w).dump();
  }
  const ptc::Status refused = Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2");
  EXPECT_EQ(refused.code(), Code::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("is not a member of job agents now"), std::string::npos) << refused.ToString();
  kv_.SetReachable(true);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(
        Eventually([&] { return Status(w)["last_error"].is_null() && Status(w)["cluster"]["member"] == true; }, kLong))
        << Status(w).dump();
  }
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  ExpectRanksEqualSynth();
}

// A change none of whose participants is live has no one to abort it: the
// workers withdraw it, and the next change goes through.
TEST_F(WorkerAgentTest, AChangeWhoseParticipantsAllLeftIsWithdrawn) {
  ptc::cluster::Coordinator outsider(admin_.get(), {kJob, 9});
  auto orphan = outsider.Propose("tp=2,pp=3,per_worker=2", 1, {7, 8}, {});
  ASSERT_TRUE(orphan.ok()) << orphan.status().ToString();
  ASSERT_TRUE(Eventually([&] { return !outsider.Pending()->has_value(); }, kLong));
  const ptc::Status why = outsider.Aborted(*orphan);
  EXPECT_NE(why.message().find("every participant of the change left the job"), std::string::npos) << why.ToString();
  ASSERT_TRUE(Reconfigure(2, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  ExpectRanksEqualSynth();
}

// A Megatron save on many workers: each writes its own ranks' files through
// its mount, one writes the latest file; the job commits it on every worker
// (each worker's pieces from the files written on it), the staged files are
// gone, and the ranks equal what was saved. A save missing a rank file is
// aborted everywhere, naming it; the next save goes through.
TEST_F(WorkerAgentTest, ASaveThroughEveryWorkerCommitsEverywhere) {
  for (int w : {0, 1}) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  ptc::Status missing = CommitSave(0, 1);
  EXPECT_EQ(missing.code(), Code::kIOError) << missing.ToString();
  EXPECT_NE(missing.message().find("iter_0000001/mp_rank_00_002/model_optim_rng.pt: written on no worker"),
            std::string::npos)
      << missing.ToString();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(Eventually([&] { return Status(w)["state"] != "saving"; }, kLong)) << w;
    EXPECT_EQ(nodes_[w].fs->snapshot()->generation(), 1u) << w;
    EXPECT_NE(Status(w)["last_error"].get<std::string>().find("written on no worker"), std::string::npos)
        << Status(w).dump();
  }
  ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(2, 1));
  const ptc::Status saved = CommitSave(0, 1);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ExpectGeneration({0, 1, 2}, 2);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(ReadFile(w, "megatron/" + std::string(ptc::megatron::kLatestFile)), "1") << w;
    EXPECT_TRUE(Status(w)["last_error"].is_null()) << Status(w).dump();
    // Each worker's pieces are those of the files written on it; the staged files are gone.
    const auto manifest = nodes_[w].fs->store().CurrentSnapshot();
    for (const ptc::ShardRecord& s : manifest->shards) {
      if (s.tensor.find("layers." + std::to_string(2 * w) + ".") != std::string::npos) {
        EXPECT_EQ(s.worker, w) << s.tensor;
      }
    }
    EXPECT_TRUE(Eventually([&] { return !std::filesystem::exists(Store(w) + "/ingest/iter_0000001"); }, kLong)) << w;
  }
  ExpectRanksEqualSynth();
}

// A save's staged rank files become its pieces' files (linked into the
// generation, not copied: CheckpointSource::adopt_files). A handle still open
// for writing on one when the save is taken writes no more, so the committed
// bytes stay those that were saved.
TEST_F(WorkerAgentTest, ARankFileOfASaveIsLinkedAndAnOpenHandleWritesNoMore) {
  for (int w : {0, 1}) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  Filesystem& fs = *nodes_[2].fs;
  uint64_t fh = 0;
  for (int tp = 0; tp < 2; ++tp) {
    const std::string dir =
        "megatron/" + ptc::megatron::IterationDirName(1) + "/" + ptc::megatron::RankDirName(tp, 2, 3);
    const std::string bytes = ReadFile(SavedAt(1), dir + "/" + std::string(ptc::megatron::kRankFile));
    uint64_t ino = kRootInode;
    for (const auto& part : std::filesystem::path(dir)) {
      auto e = fs.Lookup(ino, part.string());
      if (!e.ok()) e = fs.Mkdir(ino, part.string());
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      ino = e->ino;
    }
    auto created = fs.Create(ino, std::string(ptc::megatron::kRankFile), O_RDWR | O_CREAT | O_TRUNC);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ASSERT_TRUE(fs.Write(created->second.fh, bytes.data(), bytes.size(), 0).ok());
    if (tp == 0) {
      fh = created->second.fh;  // kept open
    } else {
      fs.Release(created->second.fh);
    }
  }
  const ptc::Status saved = CommitSave(0, 1);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ExpectGeneration({0, 1, 2}, 2);
  auto late = fs.Write(fh, "late", 4, 0);
  EXPECT_EQ(late.status().code(), Code::kPermissionDenied) << late.status().ToString();
  fs.Release(fh);
  // Worker 2's pieces lie in its rank files, linked into the generation.
  const std::string linked =
      ptc::GenerationDirName(2) + "/worker-02/mp_rank_00_002." + std::string(ptc::megatron::kRankFile);
  EXPECT_TRUE(std::filesystem::exists(Store(2) + "/" + linked)) << linked;
  int in_rank_files = 0;
  for (const ptc::ShardRecord& r : fs.store().CurrentSnapshot()->shards) {
    if (r.worker == 2 && r.file.ends_with(ptc::megatron::kRankFile)) in_rank_files++;
  }
  EXPECT_GT(in_rank_files, 0);
  ExpectRanksEqualSynth();
}

// A worker that dies in the middle of a save (after its files, before the
// commit) aborts it on every worker, naming it: nothing is committed.
TEST_F(WorkerAgentTest, AWorkerLostMidSaveAbortsIt) {
  for (int w = 0; w < kWorkers; ++w) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  nodes_[2].link->Cut(true);  // dying: it sees the save no more
  ptc::Status result;
  std::thread commit([&] { result = CommitSave(0, 1); });
  ASSERT_TRUE(Eventually([&] { return admin_->Get(ptc::cluster::PartKey(kJob, 2, 1))->has_value(); }, kLong))
      << "worker 1 never published its part: " << Status(1).dump();
  Kill(2);
  commit.join();
  EXPECT_EQ(result.code(), Code::kIOError) << result.ToString();
  EXPECT_NE(result.message().find("worker 2 left the job"), std::string::npos) << result.ToString();
  auto committed = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).GetCommitted();
  ASSERT_TRUE(committed.ok() && *committed);
  EXPECT_EQ((*committed)->generation, 1u);
  for (int w : {0, 1}) {
    EXPECT_TRUE(Eventually([&] { return Status(w)["state"] != "saving"; }, kLong)) << w;
    EXPECT_EQ(nodes_[w].fs->snapshot()->generation(), 1u) << w;
  }
}

// A save aborted by a worker's death is no save: the survivors' recovery
// commits the generation the save would have had, and is not taken for it (no
// change copying "the save's" pieces to their replicas follows).
TEST_F(WorkerAgentTest, AnAbortedSaveIsNotTakenForTheRecoveryAfterIt) {
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  for (int w = 0; w < kWorkers; ++w) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  nodes_[2].link->Cut(true);  // dying: it sees the save no more
  ptc::Status result;
  std::thread commit([&] { result = CommitSave(0, 1); });
  ASSERT_TRUE(Eventually([&] { return admin_->Get(ptc::cluster::PartKey(kJob, 3, 1))->has_value(); }, kLong))
      << "worker 1 never published its part: " << Status(1).dump();
  Kill(2);
  commit.join();
  EXPECT_EQ(result.code(), Code::kIOError) << result.ToString();
  ExpectGeneration({0, 1}, 3);  // the survivors' recovery
  // Taken for the save, it would be followed by a copy change at the agents' next look.
  EXPECT_FALSE(Eventually([&] { return nodes_[0].fs->snapshot()->generation() > 3; }, std::chrono::seconds(3)))
      << Status(0).dump();
  ExpectRanksEqualSynth();
}

// A recovery that cannot run while a worker is away (no replicas: its
// pieces on no live worker) leaves the survivors "failed"; once that worker
// is back and the job whole again, they say "serving", the failure kept as
// earlier_error.
TEST_F(WorkerAgentTest, StatusServesAgainOnceTheJobIsWhole) {
  // Worker 0 saw worker 2 live first (a worker never seen is not counted lost).
  ASSERT_TRUE(Eventually([&] { return Status(0)["cluster"]["members"] == nlohmann::json({0, 1, 2}); }, kLong))
      << Status(0).dump();
  Kill(2);
  ASSERT_TRUE(Eventually([&] { return Status(0)["state"] == "failed"; }, kLong)) << Status(0).dump();
  const std::string failure = Status(0)["last_error"].get<std::string>();
  EXPECT_NE(failure.find("cannot be recovered"), std::string::npos) << failure;
  ASSERT_TRUE(Start(2).ok());
  ASSERT_TRUE(Eventually([&] { return Status(0)["state"] == "serving"; }, kLong)) << Status(0).dump();
  EXPECT_TRUE(Status(0)["last_error"].is_null()) << Status(0).dump();
  EXPECT_EQ(Status(0)["earlier_error"], failure + " (resolved: every worker of generation 1 is live again)");
  ExpectGeneration({0, 1, 2}, 1);
  ExpectRanksEqualSynth();
}

// With replicas=2, a save's pieces (each on the worker that wrote it) are
// copied to their keepers by a change of the job's own right after it.
TEST_F(WorkerAgentTest, ASaveIsCopiedToItsReplicas) {
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  for (int w = 0; w < kWorkers; ++w) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  const ptc::Status saved = CommitSave(1, 1);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ExpectGeneration({0, 1, 2}, 4);                // the save, then its copies
  std::map<std::string, std::set<int>> holders;  // piece -> the workers holding it
  for (const ptc::ShardRecord& s : nodes_[0].fs->store().CurrentSnapshot()->shards) {
    std::string key = s.tensor;
    for (const ptc::Box& b : s.boxes) key += " " + b.ToString();
    holders[key].insert(s.worker);
  }
  ASSERT_FALSE(holders.empty());
  for (const auto& [piece, workers] : holders) EXPECT_EQ(workers.size(), 2u) << piece;
  EXPECT_EQ(ReadFile(2, "megatron/" + std::string(ptc::megatron::kLatestFile)), "1");
  ExpectRanksEqualSynth();
}

// A worker slow to commit a save on its own disk while the job goes on: the
// copy to the replicas right after pulls the pieces that worker wrote for the
// save, which its peer server serves from the moment its part is published
// (not only once it committed: a 404 there aborted the copy), and every piece
// ends on two workers.
TEST_F(WorkerAgentTest, ThePiecesOfAPeerSlowToCommitAreServedFromItsPart) {
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2,replicas=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  lagging_ = 2;
  lag_at_ = 3;  // the save
  for (int w = 0; w < kWorkers; ++w) ASSERT_NO_FATAL_FAILURE(SaveOwnRanks(w, 1));
  const ptc::Status saved = CommitSave(1, 1);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  // Workers 0 and 1 committed the save and wrote their parts of the copy (generation 4),
  // their copies of worker 2's save pulled from it, while worker 2 still commits the save.
  const bool copied = Eventually(
      [&] {
        return admin_->Get(ptc::cluster::PartKey(kJob, 4, 0))->has_value() &&
               admin_->Get(ptc::cluster::PartKey(kJob, 4, 1))->has_value();
      },
      kLong);
  EXPECT_EQ(nodes_[2].fs->snapshot()->generation(), 2u);
  lag_at_ = 0;
  ASSERT_TRUE(copied) << Status(0).dump() << Status(1).dump();
  ExpectGeneration({0, 1, 2}, 4);
  std::map<std::string, std::set<int>> holders;  // piece -> the workers holding it
  for (const ptc::ShardRecord& s : nodes_[0].fs->store().CurrentSnapshot()->shards) {
    std::string key = s.tensor;
    for (const ptc::Box& b : s.boxes) key += " " + b.ToString();
    holders[key].insert(s.worker);
  }
  for (const auto& [piece, workers] : holders) EXPECT_EQ(workers.size(), 2u) << piece;
  ExpectRanksEqualSynth();
}

// Every worker lost with its disk, etcd surviving: started again on empty
// stores, each restores its share of the durable tier's copy (made in the
// layout of its day) as the generation after the lost one, which replaces it
// in etcd; the lowest worker then moves the job back to the lost layout.
TEST_F(WorkerAgentTest, EveryWorkerLostWithItsDiskComesBackFromTheDurableTier) {
  durable_ = {tmp_ / "tier", nullptr, tmp_ / "tier"};
  std::filesystem::create_directories(durable_.dir);
  auto stop_all = [&] {  // all at once, as a power cut: none recovers onto the others first
    std::vector<int64_t> leases;
    for (int w = 0; w < kWorkers; ++w) leases.push_back(LeaseOf(w));
    for (Node& n : nodes_) n.link->Cut(true);
    for (Node& n : nodes_) n.Stop();
    for (int64_t lease : leases) EXPECT_TRUE(kv_.ExpireLease(lease));
  };
  stop_all();
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(Start(w).ok()) << w;
  auto complete = [&] {
    for (int w = 0; w < kWorkers; ++w) {
      if (Status(w)["cluster"]["durable"]["copy"] != "complete") return false;
    }
    return true;
  };
  ASSERT_TRUE(Eventually(complete, kLong)) << Status(0).dump();
  ASSERT_TRUE(Reconfigure(1, "tp=1,pp=6,per_worker=2").ok());
  ExpectGeneration({0, 1, 2}, 2);
  ASSERT_TRUE(Eventually(complete, kLong)) << Status(0).dump();  // the copy serves the new layout too
  const ptc::cluster::Committed lost = Committed();
  stop_all();
  for (int w = 0; w < kWorkers; ++w) {
    std::filesystem::remove_all(Store(w));
    std::filesystem::create_directories(Store(w));
  }
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(Start(w).ok()) << w;
  ExpectGeneration({0, 1, 2}, 4);  // 3 restored in the copy's layout, 4 the lost one's again
  EXPECT_EQ(Committed().config, lost.config);
  EXPECT_EQ(Committed().contents, lost.contents);  // the tier's copy is still the job's
  ExpectRanksEqualSynth();
  EXPECT_TRUE(Eventually(complete, kLong)) << Status(0).dump();
}

// Workers that compact any generation read from more than one piece per
// shard, into rank files: the job compacts through the protocol.
class WorkerCompactionTest : public WorkerAgentTest {
 protected:
  WorkerCompactionTest() {
    policy_.max_pieces_per_shard = 1;
    policy_.rank_files = true;
  }

  // Reconfigures to tp=1,pp=6 and waits until the job's compaction after it
  // runs with workers 0 and 1's parts published, worker 2 holding its back.
  void CompactionHeldOnWorker2() {
    held_[2] = true;
    ASSERT_TRUE(Reconfigure(1, "tp=1,pp=6,per_worker=2").ok());
    ASSERT_TRUE(Eventually(
        [&] {
          return admin_->Get(ptc::cluster::PartKey(kJob, 3, 0))->has_value() &&
                 admin_->Get(ptc::cluster::PartKey(kJob, 3, 1))->has_value() &&
                 Status(2)["compaction"]["state"] == "running";
        },
        kLong))
        << "the compaction is not under way: " << Status(0).dump() << Status(2).dump();
  }
};

// A reconfigure leaves a fragmented covering: the lowest live worker proposes
// a compaction, every worker rewrites its own pieces into its ranks' rank
// files, and all commit the same generation; the tensors are the same bytes.
TEST_F(WorkerCompactionTest, AFragmentedGenerationIsCompactedByEveryWorker) {
  const std::string contents = Committed().contents;
  ASSERT_TRUE(Reconfigure(1, "tp=1,pp=6,per_worker=2").ok());
  ExpectGeneration({0, 1, 2}, 3);  // the reconfigure, then the job's compaction
  const ptc::cluster::Committed committed = Committed();
  EXPECT_EQ(committed.config, ptc::ParseConfig("tp=1,pp=6,per_worker=2")->ToString());
  EXPECT_EQ(committed.contents, contents);  // no byte changed
  for (int w = 0; w < kWorkers; ++w) {
    // "done" once its compaction thread is over, a moment after the generation is served.
    EXPECT_TRUE(Eventually([&] { return Status(w)["compaction"]["state"] == "done"; }, kLong)) << Status(w).dump();
    const nlohmann::json status = Status(w);
    EXPECT_EQ(status["compaction"]["pieces"], status["compaction"]["shards"]) << status.dump();
    EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
    // Its own pieces: written by the compaction, in its ranks' rank files.
    char dir[64];
    std::snprintf(dir, sizeof(dir), "gen-%06d/worker-%02d/", 3, w);
    size_t in_rank_files = 0;
    for (const ptc::ShardRecord& s : nodes_[w].fs->store().CurrentSnapshot()->shards) {
      if (s.worker != w || s.nbytes == 0) continue;
      EXPECT_TRUE(s.file.starts_with(dir)) << s.file;
      in_rank_files += s.file.ends_with(".safetensors");
      EXPECT_TRUE(std::filesystem::exists(Store(w) + "/" + s.file)) << s.file;
    }
    EXPECT_GT(in_rank_files, 0u) << "worker " << w;
  }
  ExpectRanksEqualSynth();
}

// A reconfigure asked while the job's compaction runs (worker 2 holds back
// its part, the others wait for it) goes first: the compaction is aborted on
// every worker, nothing of it committed, and the reconfigure commits.
TEST_F(WorkerCompactionTest, AReconfigureProposedWhileACompactionRunsWins) {
  ASSERT_NO_FATAL_FAILURE(CompactionHeldOnWorker2());
  auto pending = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).Pending();
  ASSERT_TRUE(pending.ok() && *pending);
  EXPECT_EQ((*pending)->request, "compact rank-files");
  EXPECT_EQ((*pending)->from, 2u);
  const std::string back = ptc::ParseConfig("tp=2,pp=3,per_worker=2")->ToString();
  const ptc::Status asked = Reconfigure(1, back);
  ASSERT_TRUE(asked.ok()) << asked.ToString();
  held_[2] = false;
  ExpectGeneration({0, 1, 2}, 3);
  EXPECT_EQ(Committed().config, back);
  for (int w = 0; w < kWorkers; ++w) {
    const nlohmann::json status = Status(w);
    EXPECT_EQ(status["compaction"]["state"], "cancelled") << status.dump();
    EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  }
  ExpectRanksEqualSynth();
}

// A compaction whose part fails on one worker (its part cannot be made
// durable) commits nowhere: that worker says failed, naming why, the others
// cancelled, naming it; the job keeps the reconfigure's generation (and does
// not try again for it), and the next change goes through.
TEST_F(WorkerCompactionTest, ACompactionThatFailsOnOneWorkerCommitsNowhere) {
  failing_[2] = true;
  ASSERT_TRUE(Reconfigure(1, "tp=1,pp=6,per_worker=2").ok());
  auto ended = [&](int w) {
    const std::string state = Status(w)["compaction"]["state"];
    return state == "failed" || state == "cancelled";
  };
  ASSERT_TRUE(Eventually([&] { return ended(0) && ended(1) && ended(2); }, kLong))
      << Status(0).dump() << Status(2).dump();
  const nlohmann::json failed = Status(2);
  EXPECT_EQ(failed["compaction"]["state"], "failed") << failed.dump();
  EXPECT_NE(failed["last_error"].dump().find("syncfs failed (injected)"), std::string::npos) << failed.dump();
  for (int w : {0, 1}) {
    const nlohmann::json status = Status(w);
    EXPECT_EQ(status["compaction"]["state"], "cancelled") << status.dump();
    EXPECT_NE(status["compaction"]["why"].dump().find("worker 2 failed"), std::string::npos) << status.dump();
    EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  }
  ExpectGeneration({0, 1, 2}, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a few looks of the agents
  auto pending = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).Pending();
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(pending->has_value()) << (*pending)->request;
  EXPECT_EQ(Committed().generation, 2u);
  ExpectRanksEqualSynth();
  failing_[2] = false;
  ASSERT_TRUE(Reconfigure(0, "tp=2,pp=3,per_worker=2").ok());
  ExpectGeneration({0, 1, 2}, 3);
  ExpectRanksEqualSynth();
}

// A save committed while the job's compaction runs (worker 2 holds back its
// part) goes first: the compaction is aborted on every worker, and the save
// commits on all of them.
TEST_F(WorkerCompactionTest, ASaveWhileACompactionRunsWins) {
  ASSERT_NO_FATAL_FAILURE(CompactionHeldOnWorker2());
  // The save in the job's grid (tp=1,pp=6): worker w writes the files of pp stages 2w, 2w + 1.
  Filesystem& at = SavedAt(1);
  ASSERT_TRUE(at.controller().Reconfigure("tp=1,pp=6,per_worker=2\n", at.snapshot()).ok());
  ASSERT_TRUE(Eventually([&] { return !at.controller().Busy(); }, kLong));
  for (int w = 0; w < kWorkers; ++w) {
    for (int pp : {2 * w, 2 * w + 1}) {
      const std::string file = "megatron/" + ptc::megatron::IterationDirName(1) + "/" +
                               ptc::megatron::RankDirName(0, pp, 6) + "/" + std::string(ptc::megatron::kRankFile);
      const std::string bytes = ReadFile(at, file);
      ASSERT_FALSE(bytes.empty()) << file;
      ASSERT_TRUE(WriteFile(w, file, bytes).ok()) << file;
    }
  }
  ptc::Status saved;
  std::thread commit([&] { saved = CommitSave(0, 1); });
  const bool proposed = Eventually(
      [&] {
        auto pending = ptc::cluster::Coordinator(admin_.get(), {kJob, -1}).Pending();
        return pending.ok() && *pending && (*pending)->request == "save 1";
      },
      kLong);
  held_[2] = false;
  commit.join();
  ASSERT_TRUE(proposed) << Status(0).dump();
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ExpectGeneration({0, 1, 2}, 3);
  for (int w = 0; w < kWorkers; ++w) {
    const nlohmann::json status = Status(w);
    EXPECT_EQ(status["compaction"]["state"], "cancelled") << status.dump();
    EXPECT_EQ(ReadFile(w, "megatron/" + std::string(ptc::megatron::kLatestFile)), "1") << w;
  }
  ExpectRanksEqualSynth();
}

}  // namespace
}  // namespace ptcfs::worker
