// Copy-free repartitioning (transform/covering.h): a layout change committed
// as a covering of the pieces already stored, compaction, and garbage
// collection of pieces by reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "ptc/store/model_spec.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store_reader.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/execute.h"
#include "view/export.h"

namespace ptc::transform {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

// tp 1, 2 or 4; five layers, so stages can be uneven.
constexpr const char* kLlama = "layers=5,hidden=32,heads=8,kv_heads=4,vocab=48,seq=8,ffn=40";

// The shard files (*.h5) under the store, relative to it.
std::set<std::string> ShardFiles(const std::string& store) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(store)) {
    if (e.is_regular_file() && e.path().extension() == ".h5") out.insert(fs::relative(e.path(), store).string());
  }
  return out;
}

std::set<std::string> FilesOf(const GenerationManifest& m) {
  std::set<std::string> out;
  for (const ShardRecord& s : m.shards) out.insert(s.file);
  return out;
}

// Every target shard of `keys` is read, on its worker, from pieces on that worker only.
void ExpectEachWorkerReadsItsOwnPieces(const GenerationReader& reader,
                                       const std::vector<std::pair<ShardKey, int>>& keys) {
  for (const auto& [key, worker] : keys) {
    for (const Box& box : key.boxes) {
      Status s = reader.Cover(key.tensor, box, worker,
                              [&, w = worker](const ShardRecord& piece, const Box&, uint64_t, const Box&) {
                                EXPECT_EQ(piece.worker, w) << key.tensor << " " << box.ToString();
                                return Status::OK();
                              });
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
}

// Tensor bytes of the distinct pieces a generation references.
uint64_t PieceBytes(const GenerationManifest& m) {
  uint64_t n = 0;
  for (const ShardRecord* s : DistinctPieces(m)) n += s->nbytes;
  return n;
}

TEST(Covering, EveryChangeKindOnOneWorkerCopiesNothing) {
  ModelSpec spec = Spec("llama", kLlama, DType::kBF16, /*optimizer=*/true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,per_worker=64"), 21);
  const std::set<std::string> imported = ShardFiles(tmp / "store");
  uint64_t one_copy;
  {
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    one_copy = PieceBytes((*store)->current());
  }
  // tp up and down, pp even and uneven, dp, ZeRO-1 on and off: each from the
  // covering the previous change committed.
  const char* chain[] = {"tp=4,pp=1",
                         "tp=1,pp=5",
                         "tp=2,pp=2,pp_layers=2+3,dp=2",
                         "tp=4,pp=1,dp=2,zero=1",
                         "tp=1,pp=1,dp=3,zero=1",
                         "tp=2,pp=5,dp=2",
                         "tp=4,pp=2,pp_layers=4+1"};
  for (const char* text : chain) {
    const ParallelConfig to = *ParseConfig(std::string(text) + ",per_worker=64");
    SCOPED_TRACE(to.ToString());
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    auto r = Transform(**store, to, ExecuteOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes_written, 0u);
    EXPECT_EQ(r->shards_written, 0u);
    EXPECT_EQ(r->bytes_referenced, one_copy);
    ASSERT_TRUE((*store)->CollectGarbage().ok());
    // Not a byte written, not a piece removed: the imported files are all there is.
    EXPECT_EQ(ShardFiles(tmp / "store"), imported);
    EXPECT_EQ(PieceBytes((*store)->current()), one_copy);
    ASSERT_TRUE(VerifyGeneration(**store, (*store)->current()).ok());
    ExpectStoreHolds(tmp, spec, to, 21);
    if (HasFatalFailure()) return;
  }

  // Compact writes the last layout's shards once; a second compact writes nothing.
  const ParallelConfig last = *ParseConfig(std::string(chain[std::size(chain) - 1]) + ",per_worker=64");
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  const uint64_t before = (*store)->current_generation();
  auto compacted = Compact(**store, ExecuteOptions());
  ASSERT_TRUE(compacted.ok()) << compacted.status().ToString();
  EXPECT_EQ(compacted->generation, before + 1);
  EXPECT_GT(compacted->bytes_written, 0u);
  EXPECT_EQ(compacted->bytes_written + compacted->bytes_referenced, one_copy);
  ASSERT_TRUE((*store)->CollectGarbage().ok());
  EXPECT_EQ(ShardFiles(tmp / "store"), FilesOf((*store)->current()));
  EXPECT_EQ(PieceBytes((*store)->current()), one_copy);
  ExpectStoreHolds(tmp, spec, last, 21);
  if (HasFatalFailure()) return;
  auto again = Compact(**store, ExecuteOptions());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->generation, before + 1);
  EXPECT_EQ(again->bytes_written, 0u);
  // Each shard of the layout is now one piece: a plan of the same layout keeps every one.
  auto plan = MakePlan({&(*store)->current(), spec, last, {}, std::nullopt});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes_kept, plan->bytes_total);
}

// With several workers, each worker's ranks read only pieces on that worker:
// what no piece there holds is written for it (the parts that come from
// another worker), and nothing else.
TEST(Covering, EachWorkerReadsOnlyItsOwnPieces) {
  std::mt19937_64 rng(TestSeed());
  for (int iter = 0; iter < 8; ++iter) {
    ModelSpec spec = Spec("llama", kLlama, DType::kF32, iter % 2 == 0);
    const ParallelConfig from = RandomConfig(rng, spec), to = RandomConfig(rng, spec);
    SCOPED_TRACE(from.ToString() + " -> " + to.ToString());
    TempDir tmp;
    MakeStore(tmp, spec, from, iter);
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    auto source = (*store)->CurrentSnapshot();
    auto plan = MakePlan({source.get(), spec, to, {}, std::nullopt});
    ASSERT_TRUE(plan.ok());
    auto r = Transform(**store, to, ExecuteOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_LE(r->bytes_written, plan->bytes_moved);
    auto current = (*store)->CurrentSnapshot();
    GenerationReader reader(**store, current, /*verify=*/true);
    auto keys = TargetShardKeys(FitLayout(spec, to));
    ASSERT_TRUE(keys.ok());
    ExpectEachWorkerReadsItsOwnPieces(reader, *keys);
    if (HasFatalFailure()) return;
    // A written piece holds nothing a referenced piece on its worker holds.
    const std::string gen_dir = GenerationDirName(r->generation) + "/";
    for (const ShardRecord& a : current->shards) {
      if (a.file.rfind(gen_dir, 0) != 0) continue;
      for (const ShardRecord& b : current->shards) {
        if (b.file.rfind(gen_dir, 0) == 0 || b.worker != a.worker || b.tensor != a.tensor) continue;
        for (const Box& x : a.boxes) {
          for (const Box& y : b.boxes) EXPECT_FALSE(Intersect(x, y)) << a.tensor << " written twice on " << a.worker;
        }
      }
    }
    ExpectStoreHolds(tmp, spec, to, iter);
    if (HasFatalFailure()) return;
  }
}

// Garbage collection counts references over every generation kept (current
// and open): a piece's file goes exactly when no kept manifest names it.
// With replicas R, every piece of a slot is also on the workers of the next
// R-1 slots, wherever the placement puts the slots; a plan without the
// workers a replica covers for loses nothing, and one without every keeper
// names what it lacks.
TEST(Covering, ReplicasKeepEachSlotsPiecesOnTheNextSlotsWorkers) {
  ModelSpec spec = Spec("llama", kLlama, DType::kBF16, /*optimizer=*/true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,dp=1,per_worker=1"), 5);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  const ParallelConfig to = *ParseConfig("tp=1,pp=5,dp=1,per_worker=1,workers=0+1+4+6+7,replicas=2");
  auto r = Transform(**store, to, ExecuteOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto current = (*store)->CurrentSnapshot();
  GenerationReader reader(**store, current, /*verify=*/true);
  auto keys = TargetShardKeys(FitLayout(spec, to));
  ASSERT_TRUE(keys.ok());
  ExpectEachWorkerReadsItsOwnPieces(reader, *keys);
  if (HasFatalFailure()) return;
  std::set<int> keepers;
  for (const auto& [key, worker] : *keys) keepers.insert(worker);
  // Each worker keeps its own stage and the one of the slot before it.
  auto primary = TargetShardKeys(FitLayout(spec, *ParseConfig("tp=1,pp=5,dp=1,per_worker=1,workers=0+1+4+6+7")));
  ASSERT_TRUE(primary.ok());
  std::map<int, std::set<std::string>> own;
  for (const auto& [key, worker] : *primary) own[worker].insert(key.tensor);
  const std::vector<int> slots = {0, 1, 4, 6, 7};
  for (size_t s = 0; s < slots.size(); ++s) {
    const int keeper = slots[(s + 1) % slots.size()];
    for (const std::string& tensor : own[slots[s]]) {
      EXPECT_TRUE(std::any_of(keys->begin(), keys->end(),
                              [&](const auto& kw) { return kw.second == keeper && kw.first.tensor == tensor; }))
          << tensor << " of worker " << slots[s] << " not kept by worker " << keeper;
    }
  }
  EXPECT_EQ(keepers, (std::set<int>{0, 1, 4, 6, 7}));
  ExpectStoreHolds(tmp, spec, to, 5);
  if (HasFatalFailure()) return;
  // Without worker 4: its stage is on worker 6 as well, so nothing is missing.
  auto survive = MakePlan({current.get(),
                           spec,
                           *ParseConfig("tp=1,pp=5,dp=1,per_worker=1,workers=0+1+6+7+8"),
                           {},
                           std::set<int>{0, 1, 6, 7, 8}});
  ASSERT_TRUE(survive.ok()) << survive.status().ToString();
  EXPECT_TRUE(survive->missing.empty());
  // Without workers 4 and 6 (both keepers of slot 2's stage) its tensors are lost.
  auto lost = MakePlan({current.get(),
                        spec,
                        *ParseConfig("tp=1,pp=5,dp=1,per_worker=1,workers=0+1+7+8+9"),
                        {},
                        std::set<int>{0, 1, 7, 8, 9}});
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  ASSERT_FALSE(lost->missing.empty());
  for (const auto& [tensor, box] : lost->missing) EXPECT_TRUE(own[4].count(tensor)) << tensor;
}

TEST(Covering, CollectionRemovesAPieceExactlyWhenNothingReferencesIt) {
  ModelSpec spec = Spec("llama", kLlama, DType::kBF16, true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1"), 3);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(Transform(**store, *ParseConfig("tp=4,pp=1"), ExecuteOptions()).ok());  // 2: covers 1's pieces
  auto second = (*store)->CurrentSnapshot();
  ASSERT_TRUE(Compact(**store, ExecuteOptions()).ok());  // 3: own pieces
  auto third = (*store)->CurrentSnapshot();
  ASSERT_TRUE(Transform(**store, *ParseConfig("tp=1,pp=5"), ExecuteOptions()).ok());  // 4: covers 3's
  auto fourth = (*store)->CurrentSnapshot();
  ASSERT_EQ(fourth->generation, 4u);

  // Generation 2 still open: its pieces (generation 1's files) stay.
  ASSERT_TRUE((*store)->CollectGarbage({2}).ok());
  std::set<std::string> expected = FilesOf(*fourth);
  for (const std::string& f : FilesOf(*second)) expected.insert(f);
  EXPECT_EQ(ShardFiles(tmp / "store"), expected);
  EXPECT_TRUE(fs::exists(tmp / "store/gen-000002/manifest.json"));
  EXPECT_FALSE(fs::exists(tmp / "store/gen-000003/manifest.json"));  // its files stay: 4 references them
  EXPECT_FALSE(fs::exists(tmp / "store/gen-000001/manifest.json"));
  // Closed: only what generation 4 references.
  ASSERT_TRUE((*store)->CollectGarbage().ok());
  EXPECT_EQ(ShardFiles(tmp / "store"), FilesOf(*fourth));
  for (const std::string& f : FilesOf(*fourth)) EXPECT_TRUE(FilesOf(*third).count(f)) << f;
  ASSERT_TRUE(VerifyGeneration(**store, *fourth).ok());
  ExpectStoreHolds(tmp, spec, *ParseConfig("tp=1,pp=5"), 3);
}

// A covering references a piece without reading it: a damaged piece fails
// the reads that reach it (naming it) and a compaction, not the commit.
TEST(Covering, DamagedPieceFailsItsReadersAndCompactNotTheCommit) {
  ModelSpec spec = Spec("llama", kLlama);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1"), 8);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  const ShardRecord piece = (*store)->current().shards.front();
  std::string bytes = Slurp(tmp / ("store/" + piece.file));
  bytes[piece.offset + piece.nbytes / 2] ^= 0x01;
  Spit(tmp / ("store/" + piece.file), bytes);

  auto r = Transform(**store, *ParseConfig("tp=4,pp=1"), ExecuteOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes_written, 0u);
  Status exported =
      ptcfs::ExportCheckpoint(**store, *ParseConfig("tp=4,pp=1"), tmp / "out", CheckpointFormat::kSafetensors);
  EXPECT_EQ(exported.code(), Code::kCorruption) << exported.ToString();
  EXPECT_NE(exported.message().find(piece.file), std::string::npos) << exported.message();
  EXPECT_FALSE(fs::exists(tmp / "out"));

  const auto before = Snapshot(tmp / "store");
  auto compacted = Compact(**store, ExecuteOptions());
  EXPECT_EQ(compacted.status().code(), Code::kCorruption) << compacted.status().ToString();
  EXPECT_NE(compacted.status().message().find(piece.file), std::string::npos) << compacted.status().message();
  EXPECT_EQ((*store)->current_generation(), 2u);
  EXPECT_TRUE(Snapshot(tmp / "store") == before) << "a failed compact changed the store";
}

// MakeCovering is pure: what it references and writes, in both modes.
TEST(Covering, ReferencesWritesAndCompactBytes) {
  ModelSpec spec = Spec("llama", kLlama, DType::kF32, true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,per_worker=1"), 1);  // workers 0 and 1
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  const GenerationManifest& m = (*store)->current();
  // All on worker 0: worker 1's pieces must be written there.
  auto plan = MakePlan({&m, spec, *ParseConfig("tp=4,pp=1"), {}, std::nullopt});
  ASSERT_TRUE(plan.ok());
  const Covering cover = MakeCovering(*plan, m, CommitMode::kCovering);
  const Covering compact = MakeCovering(*plan, m, CommitMode::kCompact);
  uint64_t on_worker0 = 0;
  for (const ShardRecord& s : m.shards) on_worker0 += s.worker == 0 ? s.nbytes : 0;
  EXPECT_GT(plan->bytes_moved, 0u);
  EXPECT_EQ(cover.bytes_written, plan->bytes_moved);  // every tp=4 shard of ranks 2, 3 comes from worker 1
  EXPECT_EQ(cover.bytes_referenced, on_worker0);      // every piece of worker 0 is read by ranks 0, 1
  for (const auto& [s, worker] : cover.references) {
    EXPECT_EQ(worker, 0);
    EXPECT_EQ(m.shards[s].worker, 0);
  }
  EXPECT_EQ(compact.bytes_written, plan->bytes_total - plan->bytes_kept);
  EXPECT_EQ(compact.compact_bytes, 0u);
  // What came from worker 1 is written whole (target shards); the rest a compact writes.
  EXPECT_EQ(cover.compact_bytes + cover.bytes_written, compact.bytes_written);
  EXPECT_EQ(compact.writes.targets.size(), plan->targets.size() - compact.references.size());
}

// Workers with stores of their own (a cluster) reference only their own
// pieces: a shard identical to one on another worker is written (pulled), not
// referenced as a shared store may.
// tp=2 with rank 1's shards on worker 1, planned onto worker 0 alone (both
// ranks): rank 1's target shards are stored as they are, on worker 1.
struct OntoOneWorker {
  TempDir tmp;
  std::unique_ptr<Store> store;
  std::optional<Plan> plan;
  OntoOneWorker() {
    ModelSpec spec = Spec("llama", kLlama, DType::kF32, true);
    MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,per_worker=1"), 1);
    auto opened = Store::Open(Env::Default(), tmp / "store");
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (!opened.ok()) return;
    store = std::move(opened).value();
    auto planned = MakePlan({&store->current(), spec, *ParseConfig("tp=2,pp=1,per_worker=2"), {}, std::nullopt});
    EXPECT_TRUE(planned.ok()) << planned.status().ToString();
    if (planned.ok()) plan = std::move(planned).value();
  }
};

TEST(Covering, WorkerLocalReferencesOnlyEachWorkersOwnPieces) {
  OntoOneWorker setup;
  ASSERT_TRUE(setup.plan);
  const GenerationManifest& m = setup.store->current();
  const auto& plan = setup.plan;
  const Covering shared = MakeCovering(*plan, m, CommitMode::kCovering);
  const Covering local = MakeCovering(*plan, m, CommitMode::kWorkerLocal);
  EXPECT_EQ(shared.bytes_written, 0u);  // a shared store references worker 1's files
  EXPECT_GT(local.bytes_written, 0u);
  EXPECT_EQ(local.bytes_written, plan->bytes_moved);  // the lower bound: what worker 0 lacks
  for (const auto& [s, worker] : local.references) EXPECT_EQ(m.shards[s].worker, worker);
  for (const TargetShard& t : local.writes.targets) EXPECT_EQ(t.worker, 0);
  EXPECT_EQ(local.compact_bytes, 0u);  // what is written is whole target shards
}

// A cluster's compaction (kCompactWorkerLocal) counts a target as stored only
// on its own worker: one stored as it is on another worker is written whole
// (pulled), where kCompact of a shared store references it.
TEST(Covering, CompactWorkerLocalWritesWhatOnlyAnotherWorkerStores) {
  OntoOneWorker setup;
  ASSERT_TRUE(setup.plan);
  const GenerationManifest& m = setup.store->current();
  const auto& plan = setup.plan;
  const Covering shared = MakeCovering(*plan, m, CommitMode::kCompact);
  const Covering local = MakeCovering(*plan, m, CommitMode::kCompactWorkerLocal);
  EXPECT_EQ(shared.bytes_written, 0u);                // every target is stored as it is somewhere
  EXPECT_EQ(local.bytes_written, plan->bytes_moved);  // rank 1's, stored on worker 1 only
  EXPECT_GT(local.bytes_written, 0u);
  for (const auto& [s, worker] : local.references) EXPECT_EQ(m.shards[s].worker, worker);
  for (const TargetShard& t : local.writes.targets) EXPECT_EQ(t.worker, 0);
  EXPECT_EQ(local.compact_bytes, 0u);
  EXPECT_EQ(local.references.size() + local.writes.targets.size(), plan->targets.size());
  // Its fragmentation counts a written target by the pieces it is read from.
  EXPECT_EQ(local.fragmentation.shards, shared.fragmentation.shards);
}

// A compaction asked to stop (a mount's reconfigure) stops at its next chunk
// and commits nothing.
TEST(Covering, CancelledCompactionCommitsNothing) {
  ModelSpec spec = Spec("llama", kLlama);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=4,pp=1"), 2);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(Transform(**store, *ParseConfig("tp=1,pp=1"), ExecuteOptions()).ok());
  const auto before = Snapshot(tmp / "store");
  ExecuteOptions options;
  options.threads = 1;
  options.chunk_bytes = 1024;
  int chunks = 0;
  options.cancelled = [&] { return ++chunks == 3; };
  auto r = Compact(**store, options);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_EQ(r.status().message(), "cancelled");
  EXPECT_EQ(chunks, 3);
  EXPECT_EQ((*store)->current_generation(), 2u);
  EXPECT_TRUE(Snapshot(tmp / "store") == before);
  auto again = Compact(**store, ExecuteOptions());  // the store is fine for the next writer
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->generation, 3u);
  ExpectStoreHolds(tmp, spec, *ParseConfig("tp=1,pp=1"), 2);
}

}  // namespace
}  // namespace ptc::transform
