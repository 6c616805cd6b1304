// The round-trip property: synth(C1) -> import -> export(C2) is bit-identical
// to synth(C2), file for file, for random models and config pairs.
#include <gtest/gtest.h>

#include <filesystem>

#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "test_util.h"
#include "view/export.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

// Every file under a equals the file of the same name under b, and no file is extra.
void ExpectSameTree(const std::string& a, const std::string& b) {
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), a);
    ASSERT_TRUE(fs::exists(fs::path(b) / rel)) << rel << " missing in " << b;
    ASSERT_TRUE(Slurp(e.path()) == Slurp(fs::path(b) / rel)) << rel << " differs";
    ++files;
  }
  size_t other = 0;
  for (const auto& e : fs::recursive_directory_iterator(b)) other += e.is_regular_file();
  EXPECT_EQ(files, other);
  EXPECT_GT(files, 0u);
}

struct Case {
  ModelSpec spec;
  ParallelConfig from, to;
};

void RunCase(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.spec.schema.name + " " + c.spec.dims.ToString() + " " + std::string(DTypeName(c.spec.dtype)) +
               (c.spec.optimizer ? " adam" : "") + ": " + c.from.ToString() + " -> " + c.to.ToString());
  Env* env = Env::Default();
  TempDir tmp;
  ASSERT_TRUE(WriteSynthCheckpoint(env, ptc::testing::FitLayout(c.spec, c.from), seed, tmp / "src").ok());
  auto imported = ImportCheckpoint(env, tmp / "src", tmp / "store", c.spec.schema, c.spec.dims, c.from);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto store = Store::Open(env, tmp / "store");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Status s = ptcfs::ExportCheckpoint(**store, c.to, tmp / "out", CheckpointFormat::kSafetensors);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(WriteSynthCheckpoint(env, ptc::testing::FitLayout(c.spec, c.to), seed, tmp / "ref").ok());
  ExpectSameTree(tmp / "ref", tmp / "out");
}

TEST(RoundTrip, HandPickedHardCases) {
  const uint64_t seed = 7;
  const char* gpt = "layers=4,hidden=32,heads=4,vocab=128,seq=16";
  const char* llama = "layers=6,hidden=32,heads=8,kv_heads=2,vocab=64,seq=16,ffn=48";
  const std::vector<Case> cases = {
      // tied embeddings appear and disappear with pp; uneven stages
      {Spec("megatron-gpt", gpt, DType::kF32), *ParseConfig("tp=1,pp=1"), *ParseConfig("tp=2,pp=3,pp_layers=1+2+1")},
      // ZeRO-1 re-cut across dp and tp changes, bf16 parameters
      {Spec("megatron-gpt", gpt, DType::kBF16, true), *ParseConfig("tp=2,pp=2,dp=2,zero=1,per_worker=2"),
       *ParseConfig("tp=4,pp=1,dp=3,zero=1,per_worker=4")},
      // GQA with kv_heads < heads, SwiGLU segments, zero on -> off
      {Spec("llama", llama, DType::kBF16, true), *ParseConfig("tp=2,pp=3,dp=2,zero=1"),
       *ParseConfig("tp=1,pp=2,pp_layers=5+1,dp=1")},
      {Spec("llama", llama, DType::kF32, true), *ParseConfig("tp=1,pp=1,dp=1"), *ParseConfig("tp=2,pp=2,dp=3,zero=1")},
  };
  for (const Case& c : cases) {
    RunCase(c, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(RoundTrip, RandomModelsAndConfigPairs) {
  std::mt19937_64 rng(TestSeed());
  const std::vector<std::pair<const char*, const char*>> models = {
      {"megatron-gpt", "layers=3,hidden=16,heads=4,vocab=64,seq=8"},
      {"megatron-gpt", "layers=4,hidden=24,heads=2,vocab=40,seq=4,ffn=40"},
      {"llama", "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24"},
      {"llama", "layers=5,hidden=32,heads=8,kv_heads=4,vocab=48,seq=8,ffn=40"},
  };
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int iter = 0; iter < 24; ++iter) {
    const auto& [schema, dims] = models[rng() % models.size()];
    ModelSpec spec = Spec(schema, dims, dtypes[rng() % 3], rng() % 2 == 0);
    Case c{spec, RandomConfig(rng, spec), RandomConfig(rng, spec)};
    RunCase(c, rng());
    if (HasFatalFailure()) return;
  }
}

TEST(RoundTrip, ChainOfImportsThroughOneStore) {
  // Export to C2, import that as a new generation, export to C3, ... : the
  // store's generations stay bit-exact with synth of each config.
  std::mt19937_64 rng(TestSeed());
  ModelSpec spec = Spec("llama", "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24", DType::kBF16, true);
  Env* env = Env::Default();
  TempDir tmp;
  ParallelConfig config = RandomConfig(rng, spec);
  ASSERT_TRUE(WriteSynthCheckpoint(env, ptc::testing::FitLayout(spec, config), 3, tmp / "c0").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "c0", tmp / "store", spec.schema, spec.dims, config).ok());
  for (int step = 1; step <= 5; ++step) {
    ParallelConfig next = RandomConfig(rng, spec);
    SCOPED_TRACE(config.ToString() + " -> " + next.ToString());
    const std::string out = tmp / ("c" + std::to_string(step)), ref = tmp / ("r" + std::to_string(step));
    {
      auto store = Store::Open(env, tmp / "store");
      ASSERT_TRUE(store.ok());
      ASSERT_TRUE(ptcfs::ExportCheckpoint(**store, next, out, CheckpointFormat::kSafetensors).ok());
    }
    ASSERT_TRUE(WriteSynthCheckpoint(env, ptc::testing::FitLayout(spec, next), 3, ref).ok());
    ExpectSameTree(ref, out);
    auto imported = ImportCheckpoint(env, out, tmp / "store", spec.schema, spec.dims, next);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    EXPECT_EQ(imported->generation, static_cast<uint64_t>(step + 1));
    config = next;
  }
}

}  // namespace
}  // namespace ptc
