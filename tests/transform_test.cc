// The repartitioning engine: planner properties, transform round trips
// against synth, and fault injection at every mutating operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "ptc/base/fault_injection_env.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/shard_verify.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/execute.h"
#include "transform/layout_manifest.h"

namespace ptc::transform {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

ExecuteOptions Options(int threads = 2) {
  ExecuteOptions o;
  o.threads = threads;
  o.chunk_bytes = 1024;  // small chunks: every shard is assembled in many pieces
  return o;
}

const std::vector<std::pair<const char*, const char*>> kModels = {
    {"megatron-gpt", "layers=4,hidden=16,heads=4,vocab=64,seq=8"},
    {"megatron-gpt", "layers=3,hidden=24,heads=2,vocab=40,seq=4,ffn=40"},
    {"llama", "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24"},
    {"llama", "layers=5,hidden=32,heads=8,kv_heads=4,vocab=48,seq=8,ffn=40"},
};

ModelSpec RandomSpec(std::mt19937_64& rng) {
  const auto& [schema, dims] = kModels[rng() % kModels.size()];
  return Spec(schema, dims, rng() % 2 ? DType::kBF16 : DType::kF32, rng() % 3 != 0);
}

TEST(Transform, RandomConfigPairsMatchSynth) {
  std::mt19937_64 rng(TestSeed());
  for (int iter = 0; iter < 16; ++iter) {
    ModelSpec spec = RandomSpec(rng);
    ParallelConfig from = RandomConfig(rng, spec), to = RandomConfig(rng, spec);
    SCOPED_TRACE(spec.schema.name + " " + spec.dims.ToString() + (spec.optimizer ? " adam " : " ") + from.ToString() +
                 " -> " + to.ToString());
    TempDir tmp;
    const uint64_t seed = rng();
    MakeStore(tmp, spec, from, seed);
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    ExecuteOptions options = Options(1 + iter % 3);
    options.sweep = iter % 4 != 3;  // the general path too (no schema needs it today)
    options.mode = iter % 2 ? CommitMode::kCompact : CommitMode::kCovering;
    SCOPED_TRACE(std::string(options.sweep ? "sweep" : "general path") +
                 (iter % 2 ? ", compact" : ", covering"));
    auto r = Transform(**store, to, options);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->generation, 2u);
    // A covering writes only what must come from another worker: nothing when
    // both layouts live on one worker.
    if (options.mode == CommitMode::kCovering && from.num_workers() == 1 && to.num_workers() == 1) {
      EXPECT_EQ(r->bytes_written, 0u);
    }
    ASSERT_TRUE(VerifyGeneration(**store, (*store)->current()).ok());
    ExpectStoreHolds(tmp, spec, to, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(Transform, ChainOfFive) {
  std::mt19937_64 rng(TestSeed());
  for (const char* schema : {"megatron-gpt", "llama"}) {
    ModelSpec spec =
        Spec(schema, schema == std::string("llama") ? kModels[2].second : kModels[0].second, DType::kBF16, true);
    TempDir tmp;
    ParallelConfig config = RandomConfig(rng, spec);
    MakeStore(tmp, spec, config, 11);
    for (int step = 0; step < 5; ++step) {
      ParallelConfig next = RandomConfig(rng, spec);
      SCOPED_TRACE(std::string(schema) + " step " + std::to_string(step) + ": " + config.ToString() + " -> " +
                   next.ToString());
      auto store = Store::Open(Env::Default(), tmp / "store");
      ASSERT_TRUE(store.ok());
      auto r = Transform(**store, next, Options());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_TRUE((*store)->CollectGarbage().ok());
      ExpectStoreHolds(tmp, spec, next, 11);
      if (HasFatalFailure()) return;
      config = next;
    }
  }
}

// Embedding shards of 512 KiB at tp=2: large enough to be read through a
// mapping of the file rather than pread.
constexpr const char* kLargeDims = "layers=2,hidden=128,heads=4,vocab=2048,seq=8";

TEST(Transform, LargeShardsMatchSynth) {
  ModelSpec spec = Spec("megatron-gpt", kLargeDims);
  for (uint64_t chunk : {uint64_t{1024}, uint64_t{1} << 20}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    TempDir tmp;
    MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1"), 4);
    for (const char* to : {"tp=4,pp=1", "tp=1,pp=2"}) {
      auto store = Store::Open(Env::Default(), tmp / "store");
      ASSERT_TRUE(store.ok());
      ExecuteOptions options = Options();
      options.chunk_bytes = chunk;
      auto r = Transform(**store, *ParseConfig(to), options);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_TRUE(VerifyGeneration(**store, (*store)->current()).ok());
      ExpectStoreHolds(tmp, spec, *ParseConfig(to), 4);
      if (HasFatalFailure()) return;
    }
  }
}

// A damaged source shard (a flipped byte, or a file cut short) fails a
// transform that copies it (CommitMode::kCompact) with Corruption naming the
// shard, whichever path reads it, and leaves the store exactly as it was. (A
// covering references the piece without reading it; covering_test.cc checks
// that reads of it fail.)
TEST(Transform, CorruptSourceIsNamedAndNothingChanges) {
  ModelSpec spec = Spec("megatron-gpt", kLargeDims);
  for (const char* tensor : {"word_embeddings.weight", "layers.1.self_attention.dense.weight"}) {
    for (bool sweep : {true, false}) {
      for (bool truncate : {false, true}) {
        SCOPED_TRACE(std::string(tensor) + (sweep ? " sweep" : " general path") + (truncate ? " short" : " flipped"));
        TempDir tmp;
        MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1"), 6);
        auto store = Store::Open(Env::Default(), tmp / "store");
        ASSERT_TRUE(store.ok());
        const auto& shards = (*store)->current().shards;
        auto it = std::find_if(shards.begin(), shards.end(),
                               [&](const ShardRecord& s) { return s.tensor.find(tensor) != std::string::npos; });
        ASSERT_NE(it, shards.end());
        const ShardRecord shard = *it;
        const std::string path = tmp / ("store/" + shard.file);
        if (truncate) {
          fs::resize_file(path, shard.offset + shard.nbytes - 100);
        } else {
          std::string bytes = testing::Slurp(path);
          bytes[shard.offset + shard.nbytes * 2 / 3] ^= 0x10;
          testing::Spit(path, bytes);
        }
        const auto before = Snapshot(tmp / "store");
        ExecuteOptions options = Options();
        options.sweep = sweep;
        options.mode = CommitMode::kCompact;
        auto r = Transform(**store, *ParseConfig("tp=4,pp=1"), options);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
        const std::string& message = r.status().message();
        EXPECT_NE(message.find("tensor '" + shard.tensor + "'"), std::string::npos) << message;
        EXPECT_NE(message.find(shard.file), std::string::npos) << message;
        EXPECT_EQ((*store)->current_generation(), 1u);
        EXPECT_TRUE(Snapshot(tmp / "store") == before) << "a failed transform changed the store";
      }
    }
  }
}

TEST(Transform, PipelineAndDataOnlyChangesWriteNoTensorBytes) {
  ModelSpec spec = Spec("llama", kModels[3].second, DType::kBF16, true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,dp=1,per_worker=2"), 5);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  for (const char* to :
       {"tp=2,pp=5,dp=1,per_worker=2", "tp=2,pp=2,pp_layers=1+4,dp=2,per_worker=2", "tp=2,pp=1,dp=3,per_worker=2"}) {
    auto r = Transform(**store, *ParseConfig(to), Options());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes_written, 0u) << to;
    EXPECT_EQ(r->shards_written, 0u) << to;
  }
  ExpectStoreHolds(tmp, spec, *ParseConfig("tp=2,pp=1,dp=3,per_worker=2"), 5);
}

// Plan properties on the metadata of a real store.
struct Planned {
  std::shared_ptr<const GenerationManifest> source;
  ModelSpec spec;
  Plan plan;
};

void CheckPlanProperties(const GenerationManifest& source, const ModelSpec& spec, const ParallelConfig& to,
                         const std::optional<std::set<int>>& alive) {
  auto plan = MakePlan({&source, spec, to, {2}, alive});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto live = [&](const ShardRecord& s) { return !alive || alive->count(s.worker); };
  std::map<std::string, size_t> elem;
  for (const TensorRecord& t : source.tensors) elem[t.name] = DTypeSize(t.dtype);
  uint64_t lower_bound = 0, written = 0;
  for (size_t t = 0; t < plan->targets.size(); ++t) {
    const TargetShard& target = plan->targets[t];
    if (target.kept) {
      ASSERT_EQ(source.shards[*target.kept].worker, target.worker);
      continue;
    }
    // Every element of the target written exactly once, unless reported missing.
    for (const Box& box : target.key.boxes) {
      std::vector<int> hits(box.volume(), 0);
      for (const Copy& c : plan->copies) {
        if (c.target != t || !Intersect(c.region, box)) continue;
        ASSERT_TRUE(Contains(box, c.region));
        ASSERT_TRUE(live(source.shards[c.source]));
        for (auto [off, len] : ByteRanges(box, c.region, 1)) {
          for (uint64_t i = off; i < off + len; ++i) hits[i]++;
        }
      }
      const Box full = Box::Full(box.shape());
      for (Index i = 0; i < box.volume(); ++i) {
        ASSERT_LE(hits[i], 1) << target.key.tensor << " element written twice";
        if (hits[i] == 1) written += elem[target.key.tensor];
        // Independent lower bound: is any live replica of this element on the target's worker?
        const std::vector<Index> strides = RowMajorStrides(box.shape());
        Box e;
        Index rem = i;
        for (size_t d = 0; d < box.rank(); ++d) {
          e.begin.push_back(box.begin[d] + rem / strides[d]);
          e.end.push_back(e.begin.back() + 1);
          rem %= strides[d];
        }
        bool local = false;
        for (const ShardRecord& s : source.shards) {
          if (s.tensor != target.key.tensor || s.worker != target.worker || !live(s)) continue;
          for (const Box& b : s.boxes) local |= Contains(b, e);
        }
        if (!local) lower_bound += elem[target.key.tensor];
      }
    }
  }
  EXPECT_EQ(plan->lower_bound, lower_bound);
  if (plan->missing.empty()) {
    EXPECT_EQ(plan->bytes_moved, plan->lower_bound) << "moved bytes must equal the lower bound";
    EXPECT_EQ(written + plan->bytes_kept, plan->bytes_total);
  }
}

TEST(Plan, MovedEqualsLowerBoundAndEveryByteOnce) {
  std::mt19937_64 rng(TestSeed());
  for (int iter = 0; iter < 10; ++iter) {
    ModelSpec spec = RandomSpec(rng);
    ParallelConfig from = RandomConfig(rng, spec), to = RandomConfig(rng, spec);
    SCOPED_TRACE(spec.schema.name + " " + from.ToString() + " -> " + to.ToString());
    TempDir tmp;
    MakeStore(tmp, spec, from, 1);
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    CheckPlanProperties((*store)->current(), spec, to, std::nullopt);
    // Some workers lost: the bound still holds, unreachable regions are reported.
    std::set<int> alive;
    for (int w = 0; w < from.num_workers(); ++w) {
      if (rng() % 3) alive.insert(w);
    }
    CheckPlanProperties((*store)->current(), spec, to, alive);
    if (HasFatalFailure()) return;
  }
}

// A plan as comparable data: source shards by identity, not by index.
std::vector<std::string> Describe(const Plan& p, const GenerationManifest& m) {
  std::vector<std::string> out;
  for (const Copy& c : p.copies) {
    const ShardRecord& s = m.shards[c.source];
    std::string line = p.targets[c.target].key.tensor + "@" + std::to_string(p.targets[c.target].worker) + " <- " +
                       s.tensor + "@" + std::to_string(s.worker) + " " + c.region.ToString();
    for (const Box& b : s.boxes) line += " " + b.ToString();
    out.push_back(line);
  }
  return out;
}

TEST(Plan, DeterministicUnderRepeatAndShuffledInput) {
  std::mt19937_64 rng(TestSeed());
  ModelSpec spec = Spec("llama", kModels[3].second, DType::kBF16, true);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=1,dp=3,zero=1,per_worker=2"), 1);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  GenerationManifest m = (*store)->current();
  const ParallelConfig to = *ParseConfig("tp=4,pp=1,dp=2,per_worker=4");
  auto a = MakePlan({&m, spec, to, {1}, std::nullopt});
  auto b = MakePlan({&m, spec, to, {1}, std::nullopt});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Describe(*a, m), Describe(*b, m));
  GenerationManifest shuffled = m;
  std::shuffle(shuffled.shards.begin(), shuffled.shards.end(), rng);
  auto c = MakePlan({&shuffled, spec, to, {1}, std::nullopt});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Describe(*a, m), Describe(*c, shuffled));
  EXPECT_EQ(a->bytes_moved, c->bytes_moved);
  EXPECT_EQ(a->bottleneck, c->bottleneck);
}

TEST(Plan, LostWorkerWithoutReplicaIsNamed) {
  ModelSpec spec = Spec("megatron-gpt", kModels[0].second);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=2,dp=1,per_worker=2"), 1);  // worker 1 holds stage 1 alone
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  auto plan = MakePlan({&(*store)->current(), spec, *ParseConfig("tp=1,pp=1"), {}, std::set<int>{0}});
  ASSERT_TRUE(plan.ok());
  ASSERT_FALSE(plan->missing.empty());
  EXPECT_EQ(plan->missing.front().first.rfind("language_model.encoder.layers.2.", 0), 0u)
      << plan->missing.front().first;
  auto r = ExecutePlan(**store, (*store)->CurrentSnapshot(), spec, *ParseConfig("tp=1,pp=1"), *plan, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no live copy of: language_model.encoder.layers.2."), std::string::npos)
      << r.status().message();
  EXPECT_EQ((*store)->current_generation(), 1u);
  // With a dp replica on a live worker the same loss is harmless.
  TempDir tmp2;
  MakeStore(tmp2, spec, *ParseConfig("tp=2,pp=2,dp=2,per_worker=2"), 1);
  auto store2 = Store::Open(Env::Default(), tmp2 / "store");
  ASSERT_TRUE(store2.ok());
  auto plan2 = MakePlan({&(*store2)->current(), spec, *ParseConfig("tp=1,pp=1"), {}, std::set<int>{0, 1, 2}});
  ASSERT_TRUE(plan2.ok());
  EXPECT_TRUE(plan2->missing.empty());
}

// Runs `write` (which commits one generation above `previous`) with a fault
// injected at its n-th Env operation, for n = 0, 1, ... until it succeeds:
// every failed run leaves generation `previous` current, intact and
// verifying.
void FaultAtEveryOperation(const TempDir& tmp, uint64_t previous,
                           const std::function<Result<ExecuteResult>(Store&, int n)>& write) {
  const auto before = Snapshot(tmp / "store");
  const std::string next = GenerationDirName(previous + 1);
  FaultInjectionEnv faulty(Env::Default());
  bool committed = false;
  int n = 0;
  for (; n < 5000 && !committed; ++n) {
    faulty.Disarm();
    auto store = Store::Open(&faulty, tmp / "store");
    ASSERT_TRUE(store.ok()) << "op " << n << ": " << store.status().ToString();
    faulty.FailAfter(n);
    auto r = write(**store, n);
    faulty.Disarm();
    auto reopened = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(reopened.ok()) << "op " << n << ": " << reopened.status().ToString();
    // Only the directory fsync after the commit rename may fail with the new
    // generation current; the error says so.
    if (r.ok() || (*reopened)->current_generation() == previous + 1) {
      if (!r.ok()) {
        EXPECT_NE(r.status().message().find("committed but not durable"), std::string::npos);
      }
      committed = true;
      break;
    }
    // The previous generation is current, intact and verifies.
    ASSERT_EQ((*reopened)->current_generation(), previous) << "op " << n << ": " << r.status().ToString();
    ASSERT_TRUE(VerifyGeneration(**reopened, (*reopened)->current()).ok()) << "op " << n;
    // Everything that was there is as it was; a half-written next generation or
    // a temporary root manifest may be left behind when the fault also hit
    // their removal (readers ignore them; the next writer removes them).
    for (const auto& [path, content] : Snapshot(tmp / "store")) {
      if (path.rfind(next, 0) == 0 || path == "manifest.json.tmp") continue;
      ASSERT_TRUE(before.count(path) && before.at(path) == content) << "op " << n << " changed " << path;
    }
    for (const auto& [path, content] : before) {
      ASSERT_TRUE(fs::exists(tmp / ("store/" + path))) << "op " << n << " removed " << path;
    }
  }
  ASSERT_TRUE(committed) << "never succeeded";
  EXPECT_GT(n, 20) << "too few operations injected";
}

TEST(Transform, FaultAtEveryOperationLeavesThePreviousGeneration) {
  // Without optimizer state: fewer shards, so every operation index stays cheap to try.
  ModelSpec spec = Spec("llama", kModels[2].second, DType::kBF16, false);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=2,per_worker=2"), 9);
  // Two workers to one: the pieces of worker 1 are written for worker 0.
  const ParallelConfig to = *ParseConfig("tp=1,pp=1,dp=2");
  FaultAtEveryOperation(tmp, 1, [&](Store& store, int n) { return Transform(store, to, Options(1 + n % 2)); });
  if (HasFatalFailure()) return;
  ExpectStoreHolds(tmp, spec, to, 9);
}

TEST(Transform, FaultAtEveryOperationOfCompact) {
  ModelSpec spec = Spec("llama", kModels[2].second, DType::kBF16, false);
  TempDir tmp;
  MakeStore(tmp, spec, *ParseConfig("tp=2,pp=2"), 9);
  const ParallelConfig to = *ParseConfig("tp=1,pp=1,dp=2");
  {
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    auto r = Transform(**store, to, Options());  // a covering of generation 1's pieces
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->bytes_written, 0u);
  }
  FaultAtEveryOperation(tmp, 2, [&](Store& store, int n) { return Compact(store, Options(1 + n % 2)); });
  if (HasFatalFailure()) return;
  ExpectStoreHolds(tmp, spec, to, 9);
}

// Mixture of experts (issue 40): round trips over a matrix of (tp, cp, ep,
// etp, dp, pp) layouts, and plans for ep and etp changes.
const std::vector<const char*> kMoeModels = {
    // layer 0 dense (dense_first=1), 4 experts, shared experts
    "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=4,moe_ffn=8,shared_ffn=8,dense_first=1",
    // every other layer MoE (moe_every=2), 8 experts of ffn 4, no shared experts
    "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=8,moe_ffn=4,moe_every=2",
};

// (tp, cp, ep, etp, dp, pp) combinations, each with a per_worker that puts
// ranks on several workers.
const std::vector<const char*> kMoeConfigs = {
    "tp=1,pp=1,dp=1",
    "tp=2,pp=1,dp=2,ep=2,etp=1,per_worker=2",
    "tp=1,pp=1,dp=4,ep=4,per_worker=2",
    "tp=2,pp=1,dp=1,cp=2,ep=2,per_worker=3",
    "tp=2,pp=2,dp=2,ep=4,etp=1,per_worker=4",
    "tp=1,pp=2,dp=2,cp=2,ep=2,per_worker=2",
    "tp=2,pp=1,dp=2,ep=1,etp=1,per_worker=1",
    "tp=1,pp=2,dp=4,ep=2,etp=2,per_worker=3",
    "tp=2,pp=1,dp=2,cp=2,ep=4,etp=2,per_worker=4",
};

ParallelConfig MoeConfig(const char* text, bool zero) {
  ParallelConfig c = *ParseConfig(text);
  c.zero = zero ? 1 : 0;
  return c;
}

// synth at A, transform to B, equals synth at B: a chain through every layout
// of the matrix (each a step from the one before), for both models, with and
// without ZeRO-1, covering and compacting.
TEST(MoeTransform, ChainThroughTheMatrixMatchesSynth) {
  for (size_t m = 0; m < kMoeModels.size(); ++m) {
    for (bool zero : {false, true}) {
      const ModelSpec spec = Spec("llama", kMoeModels[m], m ? DType::kF32 : DType::kBF16, true);
      TempDir tmp;
      const uint64_t seed = 40 + m;
      ParallelConfig from = MoeConfig(kMoeConfigs[0], zero);
      MakeStore(tmp, spec, from, seed);
      for (size_t i = 1; i <= kMoeConfigs.size(); ++i) {
        // Forward through the list, then back to a layout of the middle.
        const ParallelConfig to = MoeConfig(kMoeConfigs[i < kMoeConfigs.size() ? i : 3], zero);
        SCOPED_TRACE(std::string(kMoeModels[m]) + ": " + from.ToString() + " -> " + to.ToString());
        auto store = Store::Open(Env::Default(), tmp / "store");
        ASSERT_TRUE(store.ok());
        ExecuteOptions options = Options(1 + i % 2);
        options.mode = i % 2 ? CommitMode::kCompact : CommitMode::kCovering;
        auto r = Transform(**store, to, options);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        ASSERT_TRUE(VerifyGeneration(**store, (*store)->current()).ok());
        ASSERT_TRUE((*store)->CollectGarbage().ok());
        ExpectStoreHolds(tmp, spec, to, seed);
        if (HasFatalFailure()) return;
        from = to;
      }
    }
  }
}

// Random pairs from the matrix, each transformed once.
TEST(MoeTransform, RandomPairsMatchSynth) {
  std::mt19937_64 rng(TestSeed());
  for (int iter = 0; iter < 8; ++iter) {
    const char* dims = kMoeModels[rng() % kMoeModels.size()];
    const bool zero = rng() % 2;
    const ModelSpec spec = Spec("llama", dims, DType::kBF16, rng() % 3 != 0);
    const ParallelConfig from = MoeConfig(kMoeConfigs[rng() % kMoeConfigs.size()], zero && spec.optimizer);
    const ParallelConfig to = MoeConfig(kMoeConfigs[rng() % kMoeConfigs.size()], zero && spec.optimizer);
    SCOPED_TRACE(std::string(dims) + (spec.optimizer ? " adam " : " ") + from.ToString() + " -> " + to.ToString());
    TempDir tmp;
    MakeStore(tmp, spec, from, iter);
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    auto r = Transform(**store, to, Options());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectStoreHolds(tmp, spec, to, iter);
    if (HasFatalFailure()) return;
    CheckPlanProperties((*store)->current(), spec, MoeConfig(kMoeConfigs[rng() % kMoeConfigs.size()], false),
                        std::nullopt);
    if (HasFatalFailure()) return;
  }
}

// An MLA model (DeepSeek-V3's attention, q compressed or not, with experts):
// synth at A, transform to B, equals synth at B through tp, pp, ep and ZeRO-1
// changes (the up projections cut by heads, the down projections whole).
TEST(MlaTransform, ChainMatchesSynth) {
  for (const char* dims :
       {"layers=3,hidden=16,heads=4,vocab=32,seq=8,ffn=24,q_lora=8,kv_lora=6,qk_nope=4,qk_rope=2,v_head=6,"
        "experts=4,moe_ffn=8,shared_ffn=8,dense_first=1",
        "layers=2,hidden=16,heads=4,vocab=32,seq=8,ffn=24,kv_lora=6,qk_nope=4,qk_rope=2"}) {
    const ModelSpec spec = Spec("llama", dims, DType::kBF16, true);
    const bool moe = spec.dims.experts > 0;
    TempDir tmp;
    ParallelConfig from = MoeConfig("tp=1,pp=1,dp=1", false);
    MakeStore(tmp, spec, from, 61);
    for (const char* text : {moe ? "tp=2,pp=2,dp=1,pp_layers=1+2,per_worker=2" : "tp=2,pp=2,dp=1,per_worker=2",
                             "tp=4,pp=1,dp=2,zero=1,per_worker=4",
                             moe ? "tp=2,pp=1,dp=2,ep=4,etp=1,zero=1,per_worker=2" : "tp=2,pp=1,dp=2,zero=1",
                             moe ? "tp=1,pp=2,dp=1,pp_layers=2+1" : "tp=1,pp=2,dp=1"}) {
      const ParallelConfig to = *ParseConfig(text);
      SCOPED_TRACE(std::string(dims) + ": " + from.ToString() + " -> " + to.ToString());
      auto store = Store::Open(Env::Default(), tmp / "store");
      ASSERT_TRUE(store.ok());
      CheckPlanProperties((*store)->current(), spec, to, std::nullopt);
      if (HasFatalFailure()) return;
      auto r = Transform(**store, to, Options());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ExpectStoreHolds(tmp, spec, to, 61);
      if (HasFatalFailure()) return;
      from = to;
    }
  }
}

// An ep change moves whole experts and nothing else, and the plan's lower
// bound (and moved bytes) are exactly the experts whose worker changed; an
// etp change moves only expert shards. One rank per worker.
TEST(MoePlan, EpAndEtpChangesMoveExpertsOnlyAndMovedEqualsBound) {
  const ModelSpec spec = Spec("llama", kMoeModels[0], DType::kBF16, true);
  struct Case {
    const char* from;
    const char* to;
    bool whole;  // each moved tensor moves whole (etp=1 on both sides)
  };
  for (const Case& k : {Case{"tp=1,dp=4,ep=2,per_worker=1", "tp=1,dp=4,ep=4,per_worker=1", true},
                        Case{"tp=1,dp=4,ep=4,per_worker=1", "tp=1,dp=4,ep=1,per_worker=1", true},
                        Case{"tp=2,dp=2,ep=2,etp=1,per_worker=1", "tp=2,dp=2,ep=4,etp=1,per_worker=1", true},
                        Case{"tp=2,dp=2,ep=2,etp=1,per_worker=1", "tp=2,dp=2,ep=2,per_worker=1", false},
                        Case{"tp=2,dp=2,ep=1,etp=2,per_worker=1", "tp=2,dp=2,ep=1,etp=1,per_worker=1", false},
                        Case{"tp=1,cp=2,dp=2,ep=2,per_worker=1", "tp=1,cp=2,dp=2,ep=4,per_worker=1", true},
                        // cp for dp: the weights are replicated over both, the expert grid is the same
                        Case{"tp=1,cp=2,dp=2,ep=2,per_worker=1", "tp=1,cp=1,dp=4,ep=2,per_worker=1", true},
                        Case{"tp=2,cp=2,dp=1,ep=2,etp=1,per_worker=2", "tp=2,cp=1,dp=2,ep=4,etp=1,per_worker=2", true}}) {
    const ParallelConfig from = *ParseConfig(k.from), to = *ParseConfig(k.to);
    SCOPED_TRACE(std::string(k.from) + " -> " + k.to);
    TempDir tmp;
    MakeStore(tmp, spec, from, 3);
    auto store = Store::Open(Env::Default(), tmp / "store");
    ASSERT_TRUE(store.ok());
    const GenerationManifest& source = (*store)->current();
    CheckPlanProperties(source, spec, to, std::nullopt);  // moved == lower bound, every byte once
    if (HasFatalFailure()) return;
    auto plan = MakePlan({&source, spec, to, {}, std::nullopt});
    ASSERT_TRUE(plan.ok());
    // Only expert tensors (and their optimizer state) cross workers.
    std::map<std::string, uint64_t> moved;
    for (const Copy& c : plan->copies) {
      const ShardRecord& s = source.shards[c.source];
      if (s.worker == plan->targets[c.target].worker) continue;
      EXPECT_NE(s.tensor.find(".mlp.experts.local_experts."), std::string::npos) << s.tensor << " moved";
      moved[s.tensor] += c.nbytes;
    }
    if (!k.whole) continue;
    // Whole experts: the bound counts, per worker, each expert tensor the
    // worker newly holds, whole.
    std::map<std::string, uint64_t> tensor_bytes;
    for (const TensorRecord& t : source.tensors) {
      uint64_t n = DTypeSize(t.dtype);
      for (Index d : t.shape) n *= d;
      tensor_bytes[t.name] = n;
    }
    auto holders = [&](const ParallelConfig& c) {
      std::map<std::string, std::set<int>> out;
      const ModelLayout layout = FitLayout(spec, c);
      for (int rank = 0; rank < c.world_size(); ++rank) {
        auto view = layout.View(rank);
        for (const auto* list : {&view->model, &view->optim}) {
          for (const LocalTensor& t : *list) {
            for (const Segment& s : t.segments) out[s.tensor].insert(c.WorkerOf(rank));
          }
        }
      }
      return out;
    };
    const auto before = holders(from), after = holders(to);
    uint64_t expected = 0;
    for (const auto& [tensor, workers] : after) {
      for (int w : workers) expected += before.at(tensor).count(w) ? 0 : tensor_bytes[tensor];
    }
    EXPECT_EQ(plan->lower_bound, expected);
    EXPECT_EQ(plan->bytes_moved, expected);
  }
}

// The source a store would hold, from the dims alone (ptcfs plan --from),
// plans as the real store's manifest does.
TEST(MoePlan, LayoutManifestPlansAsTheStore) {
  const ModelSpec spec = Spec("llama", kMoeModels[1], DType::kBF16, true);
  const ParallelConfig from = *ParseConfig("tp=2,pp=2,dp=2,ep=4,etp=1,zero=1,per_worker=2");
  const ParallelConfig to = *ParseConfig("tp=1,pp=1,dp=4,ep=2,per_worker=2");
  TempDir tmp;
  MakeStore(tmp, spec, from, 5);
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok());
  auto made = LayoutManifest(FitLayout(spec, from));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(made->tensors, (*store)->current().tensors);
  auto real = MakePlan({&(*store)->current(), spec, to, {}, std::nullopt});
  auto dims = MakePlan({&*made, spec, to, {}, std::nullopt});
  ASSERT_TRUE(real.ok() && dims.ok());
  EXPECT_EQ(real->bytes_total, dims->bytes_total);
  EXPECT_EQ(real->bytes_moved, dims->bytes_moved);
  EXPECT_EQ(real->lower_bound, dims->lower_bound);
  EXPECT_EQ(real->bytes_kept, dims->bytes_kept);
  EXPECT_EQ(real->targets.size(), dims->targets.size());
}

}  // namespace
}  // namespace ptc::transform
