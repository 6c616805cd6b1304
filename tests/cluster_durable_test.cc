// The durable tier (cluster/durable.h): workers' shares of a generation
// copied into a directory, the copy completed by the last of them, refused
// when it is not the job's, and read back through a PeerEnv as the only
// source of a change whose result equals synth of the new config.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cluster/durable.h"
#include "cluster/durable_restore.h"
#include "cluster/job_state.h"
#include "cluster/s3/s3_env.h"
#include "cluster/peer_env.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store_layout.h"
#include "s3_fake.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/covering.h"
#include "transform/execute.h"
#include "transform/plan.h"

namespace ptc::cluster {
namespace {

using namespace ::ptc::transform;  // the plans and executors a durable copy is made by
using testing::MakeStore;
using testing::Spec;
using testing::TempDir;

class DurableTier : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = Spec("llama", "layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96");
    // Three workers, one stage each, each stage also on the next worker.
    MakeStore(tmp_, spec_, *ParseConfig("tp=2,pp=3,dp=1,per_worker=2,replicas=2"), 7);
    auto store = Store::Open(Env::Default(), tmp_ / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    // An import stores each piece once: add each worker's pieces to the
    // next one's, as a cluster with replicas=2 keeps them (a record naming
    // the same file: one store holds every worker's files here).
    auto m = std::make_shared<GenerationManifest>(*store_->CurrentSnapshot());
    const size_t n = m->shards.size();
    for (size_t i = 0; i < n; ++i) {
      ShardRecord copy = m->shards[i];
      copy.worker = (copy.worker + 1) % 3;
      m->shards.push_back(std::move(copy));
    }
    m_ = std::move(m);
    dir_ = tmp_ / "durable";
    id_ = {"job-a", "contents-of-job-a"};
  }

  void WriteAll() {
    for (int w = 0; w < 3; ++w) ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, w, dir_).ok());
    auto done = CompleteDurable(Env::Default(), *m_, id_, 2, dir_);
    ASSERT_TRUE(done.ok() && *done) << done.status().ToString();
  }

  TempDir tmp_;
  ModelSpec spec_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<const GenerationManifest> m_;
  std::string dir_;
  DurableIdentity id_;
};

// Every distinct piece (tensor, boxes) is in exactly one worker's share: the lowest holding it.
TEST_F(DurableTier, SharesSplitThePiecesOnceAmongTheirLowestHolders) {
  std::map<std::pair<std::string, std::vector<Box>>, std::set<int>> holders;
  for (const ShardRecord& s : m_->shards) holders[{s.tensor, s.boxes}].insert(s.worker);
  std::map<std::pair<std::string, std::vector<Box>>, int> taken;
  for (int w = 0; w < 3; ++w) {
    for (const ShardRecord& s : DurableShare(*m_, w)) {
      EXPECT_EQ(s.worker, w);
      EXPECT_TRUE(taken.emplace(std::make_pair(s.tensor, s.boxes), w).second) << s.tensor << " twice";
    }
  }
  ASSERT_EQ(taken.size(), holders.size());
  for (const auto& [key, w] : taken) EXPECT_EQ(w, *holders[key].begin()) << key.first;
  EXPECT_TRUE(DurableShare(*m_, 2).empty());  // stage 2 is also on worker 0, stage 1 on worker 1
}

// Each share's bytes equal the store's; the last share completes the copy,
// which then loads as pieces of the last-resort worker.
TEST_F(DurableTier, TheLastShareCompletesTheCopy) {
  ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, 0, dir_).ok());
  auto done = CompleteDurable(Env::Default(), *m_, id_, 0, dir_);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(*done);  // worker 1's share is missing
  EXPECT_EQ(LoadDurable(Env::Default(), dir_, id_, m_->tensors).status().code(), Code::kNotFound);
  ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, 1, dir_).ok());
  done = CompleteDurable(Env::Default(), *m_, id_, 1, dir_);
  ASSERT_TRUE(done.ok() && *done) << done.status().ToString();

  auto pieces = LoadDurable(Env::Default(), dir_, id_, m_->tensors);
  ASSERT_TRUE(pieces.ok()) << pieces.status().ToString();
  EXPECT_EQ(pieces->size(), DurableShare(*m_, 0).size() + DurableShare(*m_, 1).size());
  for (const ShardRecord& d : *pieces) {
    EXPECT_EQ(d.worker, kDurableWorker);
    ASSERT_TRUE(d.file.starts_with(kDurablePrefix)) << d.file;
    const ShardRecord* original = nullptr;
    for (const ShardRecord& s : m_->shards) {
      if (s.tensor == d.tensor && s.boxes == d.boxes) original = &s;
    }
    ASSERT_NE(original, nullptr) << d.tensor;
    EXPECT_EQ(d.checksum, original->checksum);
    const std::string copy = testing::Slurp(std::filesystem::path(dir_) / d.file.substr(kDurablePrefix.size()));
    const std::string held = testing::Slurp(std::filesystem::path(tmp_ / "store") / original->file);
    EXPECT_EQ(copy.substr(d.offset, d.nbytes), held.substr(original->offset, original->nbytes)) << d.tensor;
  }
}

// A copy is refused unless it is of this job and these contents with these
// tensors; the message names the file and what differs.
TEST_F(DurableTier, RefusesAnotherJobsOrContentsOrTensors) {
  WriteAll();
  const std::string file = dir_ + "/durable.json";
  auto other_job = LoadDurable(Env::Default(), dir_, {"job-b", id_.contents}, m_->tensors);
  EXPECT_EQ(other_job.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(other_job.status().message().find("job 'job-a', not of 'job-b'"), std::string::npos)
      << other_job.status().ToString();
  EXPECT_NE(other_job.status().message().find(file), std::string::npos);
  auto older = LoadDurable(Env::Default(), dir_, {id_.job, "newer"}, m_->tensors);
  EXPECT_EQ(older.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(older.status().message().find("contents-of-job-a"), std::string::npos);
  std::vector<TensorRecord> tensors = m_->tensors;
  tensors[3].shape[0] += 1;
  auto reshaped = LoadDurable(Env::Default(), dir_, id_, tensors);
  EXPECT_EQ(reshaped.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(reshaped.status().message().find("'" + tensors[3].name + "'"), std::string::npos);

  const std::string text = testing::Slurp(file);
  testing::Spit(file, text.substr(0, text.size() / 2));
  EXPECT_EQ(LoadDurable(Env::Default(), dir_, id_, m_->tensors).status().code(), Code::kCorruption);
  // A generation manifest that is no durable copy.
  testing::Spit(file, testing::Slurp(tmp_ / "store/gen-000001/manifest.json"));
  auto plain = LoadDurable(Env::Default(), dir_, id_, m_->tensors);
  EXPECT_EQ(plain.status().code(), Code::kCorruption);
  EXPECT_NE(plain.status().message().find("no \"durable\""), std::string::npos) << plain.status().ToString();
}

// A damaged piece is not copied: the share fails naming it, and no records are written.
TEST_F(DurableTier, ADamagedPieceFailsTheShare) {
  const ShardRecord victim = DurableShare(*m_, 1).front();
  const std::filesystem::path file = std::filesystem::path(tmp_ / "store") / victim.file;
  std::string bytes = testing::Slurp(file);
  bytes[victim.offset + victim.nbytes / 2] ^= 0x20;
  testing::Spit(file, bytes);
  Status s = WriteDurableShare(Env::Default(), *store_, *m_, 1, dir_);
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find(victim.tensor), std::string::npos) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gen-000001/worker-01.json"));
}

// A stopped copy ends before its records are written: no share counts.
TEST_F(DurableTier, AStoppedCopyLeavesNoShare) {
  std::atomic<bool> stop{true};
  Status s = WriteDurableShare(Env::Default(), *store_, *m_, 0, dir_, &stop);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("cancelled"), std::string::npos) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gen-000001/worker-00.json"));
}

// Completing a newer generation's copy removes the older shares.
TEST_F(DurableTier, ACompletedCopyRemovesOlderShares) {
  ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, 0, dir_).ok());
  GenerationManifest later = *m_;
  later.generation = 5;
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, later, w, dir_).ok());
  auto done = CompleteDurable(Env::Default(), later, id_, 0, dir_);
  ASSERT_TRUE(done.ok() && *done) << done.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gen-000001"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/gen-000005/worker-00.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/durable.json.tmp-worker-00"));
}

// With every worker gone, the copy alone is the source of a change: read
// through the PeerEnv at ROOT/.durable/, and the result equals synth.
TEST_F(DurableTier, TheCopyAloneRestoresTheTensors) {
  WriteAll();
  PeerEnvOptions o;
  o.self = 0;
  o.durable_dir = dir_;
  PeerEnv env(Env::Default(), tmp_ / "store", o);
  auto store = Store::Open(&env, tmp_ / "store");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto source = std::make_shared<GenerationManifest>(*(*store)->CurrentSnapshot());
  // Worker 0's own pieces are not read either: only the tier's.
  auto pieces = LoadDurable(&env, dir_, id_, source->tensors);
  ASSERT_TRUE(pieces.ok()) << pieces.status().ToString();
  source->shards.insert(source->shards.end(), pieces->begin(), pieces->end());
  const ParallelConfig to = *ParseConfig("tp=1,pp=2,dp=1,per_worker=2");
  auto plan = MakePlan({source.get(), spec_, to, {}, std::set<int>{kDurableWorker}, {kDurableWorker}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->missing.empty());
  EXPECT_EQ(plan->bytes_moved, plan->bytes_total);
  Covering covering = MakeCovering(*plan, *source, CommitMode::kWorkerLocal);
  ExecuteOptions options;
  options.mode = CommitMode::kWorkerLocal;
  auto done = ExecuteCovering(**store, source, spec_, to, covering, options);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  store->reset();
  testing::ExpectStoreHolds(tmp_, spec_, to, 7);
}

// Where a live worker holds the bytes, the plan reads them there, not from the tier.
TEST_F(DurableTier, APlanReadsTheTierOnlyForWhatNoLiveWorkerHolds) {
  WriteAll();
  auto pieces = LoadDurable(Env::Default(), dir_, id_, m_->tensors);
  ASSERT_TRUE(pieces.ok()) << pieces.status().ToString();
  GenerationManifest source = *m_;
  source.shards.insert(source.shards.end(), pieces->begin(), pieces->end());
  // Workers 1 and 2 lost: stage 1 (on both) is only in the tier; every rank
  // moves to worker 3, which holds nothing: stages 0 and 2 come from worker 0.
  const ParallelConfig to = *ParseConfig("tp=2,pp=3,dp=1,per_worker=6,workers=3");
  auto plan = MakePlan({&source, spec_, to, {}, std::set<int>{0, 3, kDurableWorker}, {kDurableWorker}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->missing.empty());
  auto without = MakePlan({m_.get(), spec_, to, {}, std::set<int>{0, 3}});
  ASSERT_TRUE(without.ok());
  ASSERT_FALSE(without->missing.empty());
  uint64_t lost = 0;
  for (const auto& [tensor, box] : without->missing) {
    lost += box.volume() * DTypeSize(FindTensor(*m_, tensor)->dtype);
  }
  EXPECT_EQ(plan->messages.size(), 2u);
  EXPECT_EQ((plan->messages[{kDurableWorker, 3}]), lost);
  EXPECT_EQ((plan->messages[{0, 3}]), plan->bytes_total - lost);
}

// On a bucket (an S3Env; here an in-memory one that fails on demand) the
// copy's manifest is written last: a share whose upload fails leaves no
// records, no worker completes the copy while a share is missing, and the
// next try completes it; older generations' objects go once it is.
TEST_F(DurableTier, OnABucketTheManifestIsWrittenLast) {
  s3::testing::FakeS3 fake;
  struct Forward final : s3::Transport {
    s3::Transport* t;
    Result<s3::HttpResponse> Send(const s3::HttpRequest& r) override { return t->Send(r); }
  };
  auto forward = std::make_unique<Forward>();
  forward->t = &fake;
  s3::S3Config c;
  c.credentials = {"AKID", "SECRET", ""};
  auto client = std::make_shared<s3::S3Client>(c, std::move(forward),
                                               s3::RetryPolicy{2, std::chrono::milliseconds(1), std::chrono::milliseconds(1)});
  auto tier = s3::NewS3Env(client, "bkt", {16 << 10, 2});
  fake.Set("job/gen-000000/worker-00.bin", "an older copy's share");
  ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, 0, "job", nullptr, tier.get()).ok());
  fake.Inject({"PUT", "worker-01.bin", 503, 100});
  Status failed = WriteDurableShare(Env::Default(), *store_, *m_, 1, "job", nullptr, tier.get());
  EXPECT_EQ(failed.code(), Code::kIOError);
  EXPECT_NE(failed.message().find("s3://bkt/job/gen-000001/worker-01.bin"), std::string::npos) << failed.ToString();
  EXPECT_EQ(fake.objects().count("job/gen-000001/worker-01.bin"), 0u);
  EXPECT_EQ(fake.objects().count("job/gen-000001/worker-01.json"), 0u);
  EXPECT_EQ(fake.open_uploads(), 0u);
  auto done = CompleteDurable(tier.get(), *m_, id_, 0, "job");
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(*done);
  EXPECT_EQ(fake.objects().count("job/durable.json"), 0u);
  EXPECT_EQ(LoadDurable(tier.get(), "job", id_, m_->tensors).status().code(), Code::kNotFound);
  // The server answers again: the share goes in, and the copy completes.
  fake.ClearFaults();
  ASSERT_TRUE(WriteDurableShare(Env::Default(), *store_, *m_, 1, "job", nullptr, tier.get()).ok());
  done = CompleteDurable(tier.get(), *m_, id_, 1, "job");
  ASSERT_TRUE(done.ok() && *done) << done.status().ToString();
  EXPECT_EQ(fake.objects().count("job/durable.json"), 1u);
  EXPECT_EQ(fake.objects().count("job/gen-000000/worker-00.bin"), 0u);
  auto pieces = LoadDurable(tier.get(), "job", id_, m_->tensors);
  ASSERT_TRUE(pieces.ok()) << pieces.status().ToString();
  // Every piece reads back from the bucket as it is in the store.
  for (const ShardRecord& s : *pieces) {
    std::string got(s.nbytes, '\0'), want(s.nbytes, '\0');
    auto obj = tier->OpenRead(JoinPath("job", s.file.substr(kDurablePrefix.size())));
    ASSERT_TRUE(obj.ok()) << obj.status().ToString();
    ASSERT_TRUE((*obj)->Read(s.offset, s.nbytes, got.data()).ok());
    const ShardRecord* orig = nullptr;
    for (const ShardRecord& o : m_->shards) {
      if (o.tensor == s.tensor && o.boxes == s.boxes) orig = &o;
    }
    ASSERT_NE(orig, nullptr);
    auto local = Env::Default()->OpenRead(std::string(tmp_ / "store") + "/" + orig->file);
    ASSERT_TRUE(local.ok());
    ASSERT_TRUE((*local)->Read(orig->offset, orig->nbytes, want.data()).ok());
    EXPECT_EQ(got, want) << s.tensor;
  }
}

}  // namespace
}  // namespace ptc::cluster

namespace ptc::cluster {
namespace {

// A store of worker `w` (empty: a new disk) whose other workers' files count as present.
struct EmptyWorkerStore {
  EmptyWorkerStore(const std::filesystem::path& root, int w, const std::string& durable) {
    PeerEnvOptions o;
    o.self = w;
    o.durable_dir = durable;
    env = std::make_unique<PeerEnv>(Env::Default(), root, o);
    auto created = Store::Create(env.get(), root);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (created.ok()) store = std::move(*created);
  }
  std::unique_ptr<PeerEnv> env;
  std::unique_ptr<Store> store;
};

// Every worker lost with its disk: each restores its own share of the copy
// into an empty store, all three commit the same generation (one digest),
// and together they hold synth's tensors bit for bit.
TEST_F(DurableTier, EveryWorkerRestoresItsShareIntoAnEmptyStore) {
  WriteAll();
  const DurableLocation tier{dir_, nullptr, dir_};
  auto copy = ReadDurableCopy(tier, id_.job);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(copy->id.contents, id_.contents);
  EXPECT_FALSE(copy->manifest.extra.contains("durable"));
  auto restored = RestoredManifest(copy->manifest, 9);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  TempDir out;
  std::set<std::string> digests;
  for (int w = 0; w < 3; ++w) {
    EmptyWorkerStore s(out / ("w" + std::to_string(w)), w, dir_);
    ASSERT_TRUE(s.store);
    Status done = RestoreShare(tier, copy->manifest, *restored, w, *s.store);
    ASSERT_TRUE(done.ok()) << done.ToString();
    auto current = s.store->CurrentSnapshot();
    EXPECT_EQ(current->generation, 9u);
    EXPECT_EQ(current->config, m_->config);
    digests.insert(PiecesDigest(current->config, current->shards));
    for (const ShardRecord& r : current->shards) {
      if (r.worker == w) EXPECT_TRUE(VerifyShard(Env::Default(), *s.store, r).ok()) << r.tensor;
    }
  }
  EXPECT_EQ(digests, std::set<std::string>{PiecesDigest(restored->config, restored->shards)});
  // One store holding the three workers' files reads as synth of the copy's config.
  std::filesystem::copy(out / "w0", out / "store", std::filesystem::copy_options::recursive);
  for (int w = 1; w < 3; ++w) {
    const std::filesystem::path dir = std::filesystem::path("gen-000009") / WorkerDirName(w);
    const std::filesystem::path from = std::filesystem::path(out / ("w" + std::to_string(w))) / dir;
    if (std::filesystem::exists(from)) {
      std::filesystem::copy(from, std::filesystem::path(out / "store") / dir, std::filesystem::copy_options::recursive);
    }
  }
  testing::ExpectStoreHolds(out, spec_, *ParseConfig(m_->config), 7);
}

// The tier's job record names the job's latest layout of the copy's
// contents; one of older contents or another job is not the copy's; a
// malformed one is refused naming it.
TEST_F(DurableTier, TheJobRecordNamesTheLatestLayoutOfTheCopysContents) {
  WriteAll();
  const DurableLocation tier{dir_, nullptr, dir_};
  auto copy = ReadDurableCopy(tier, id_.job);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_FALSE(copy->latest.has_value());
  const std::string record = JoinPath(dir_, kJobRecord);
  const JobRecord r{id_.job, 7, "tp=1,pp=2,dp=1,per_worker=2", id_.contents};
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), record, EncodeJobRecord(r)).ok());
  copy = ReadDurableCopy(tier, id_.job);
  ASSERT_TRUE(copy.ok() && copy->latest) << copy.status().ToString();
  EXPECT_EQ(copy->latest->generation, 7u);
  EXPECT_EQ(copy->latest->config, r.config);
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), record, EncodeJobRecord({id_.job, 8, r.config, "older"})).ok());
  copy = ReadDurableCopy(tier, id_.job);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_FALSE(copy->latest.has_value());
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), record, "{\"job\": 3}").ok());
  copy = ReadDurableCopy(tier, id_.job);
  EXPECT_EQ(copy.status().code(), Code::kCorruption) << copy.status().ToString();
  EXPECT_NE(copy.status().message().find("job.json"), std::string::npos) << copy.status().ToString();
}

// A share altered in the tier is refused naming the tensor; the store keeps no generation.
TEST_F(DurableTier, AnAlteredShareIsNotRestored) {
  WriteAll();
  const DurableLocation tier{dir_, nullptr, dir_};
  auto copy = ReadDurableCopy(tier, id_.job);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  const ShardRecord& first = *std::find_if(copy->manifest.shards.begin(), copy->manifest.shards.end(),
                                           [](const ShardRecord& s) { return s.worker == 0 && s.nbytes > 0; });
  {
    std::fstream f(std::filesystem::path(dir_) / first.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(first.offset));
    f.put('\x5a');
  }
  auto restored = RestoredManifest(copy->manifest, 9);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  TempDir out;
  EmptyWorkerStore s(out / "w0", 0, dir_);
  Status done = RestoreShare(tier, copy->manifest, *restored, 0, *s.store);
  EXPECT_EQ(done.code(), Code::kCorruption) << done.ToString();
  EXPECT_NE(done.message().find("tensor '" + first.tensor + "'"), std::string::npos) << done.message();
  EXPECT_NE(done.message().find("altered"), std::string::npos) << done.message();
  EXPECT_FALSE(s.store->has_generation());
  // Another job's copy is not restored at all.
  EXPECT_EQ(ReadDurableCopy(tier, "job-b").status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace ptc::cluster
