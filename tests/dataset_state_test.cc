// The dataset state record in the store: JSON (decoding fuzzed), import,
// re-import, position changes; every rejected operation leaves the store's
// files byte for byte as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "ptc/base/fault_injection_env.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/dataset/state.h"
#include "ptc/dataset/synth.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/shard_verify.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream s;
    if (e.is_regular_file()) s << in.rdbuf();
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? s.str() : "<dir>";
  }
  return files;
}

DatasetState Sample() {
  DatasetState s;
  s.source = "/data/corpus";
  s.files = {{"/data/corpus.idx", 1234}, {"/data/corpus.bin", 99999}};
  s.index_checksum = 0x0123456789abcdefULL;
  s.num_samples = 1000;
  s.global_batch = 32;
  s.seed = 7;
  s.epoch = 2;
  s.consumed = 320;
  s.length_buckets = {4096, 16384};
  return s;
}

TEST(DatasetStateJsonTest, RoundTrip) {
  DatasetState s = Sample();
  auto back = DecodeDatasetState("m", EncodeDatasetState(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  s.format = DatasetFormat::kJsonl;
  s.files.resize(1);
  s.index = "dataset/jsonl-0123456789abcdef.index";
  s.length_buckets.clear();
  s.consumed = 1000;  // the epoch's end
  back = DecodeDatasetStateText("m", EncodeDatasetState(s).dump());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
}

TEST(DatasetStateJsonTest, ErrorsNameTheField) {
  const json good = EncodeDatasetState(Sample());
  struct Case {
    std::function<void(json&)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j = json::array(); }, "must be a JSON object"},
      {[](json& j) { j.erase("format"); }, "\"format\" is missing"},
      {[](json& j) { j["format"] = "tfrecord"; }, "\"format\" is 'tfrecord'"},
      {[](json& j) { j["source"] = ""; }, "\"source\" must not be empty"},
      {[](json& j) { j["files"] = json::array(); }, "\"files\" must be an array of 2"},
      {[](json& j) { j["files"][1]["size"] = -1; }, "files[1]: \"size\" must be a non-negative integer"},
      {[](json& j) { j["index_checksum"] = "xxh64:12"; }, "\"index_checksum\" is malformed"},
      {[](json& j) { j["samples"] = 0; }, "\"samples\" must be at least 1"},
      {[](json& j) { j["global_batch"] = 0; }, "\"global_batch\" must be at least 1"},
      {[](json& j) { j["seed"] = "7"; }, "\"seed\" must be a non-negative integer"},
      {[](json& j) { j["consumed"] = 1001; }, "\"consumed\" exceeds samples"},
      {[](json& j) { j["consumed"] = 33; }, "\"consumed\" is not a multiple of global_batch"},
      {[](json& j) {
         j["length_buckets"] = {5, 5};
       },
       "\"length_buckets\" is invalid"},
      {[](json& j) { j["length_buckets"] = "4096"; }, "\"length_buckets\" must be an array"},
      {[](json& j) {
         j["format"] = "jsonl";
         j["files"].erase(1);
         j["index"] = "../x";
       },
       "\"index\" must be a relative"},
      {[](json& j) {
         j["format"] = "jsonl";
         j["files"].erase(1);
         j["index"] = "i";
       },
       "only supported for megatron"},
  };
  for (const Case& c : cases) {
    json j = good;
    c.mutate(j);
    auto r = DecodeDatasetState("gen-000003/manifest.json", j);
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.expect << " | " << r.status().message();
    EXPECT_EQ(r.status().message().rfind("gen-000003/manifest.json: dataset", 0), 0u) << r.status().message();
  }
  EXPECT_NE(DecodeDatasetStateText("m", "{\"format\":").status().message().find("not valid JSON"), std::string::npos);
}

// Mini-fuzz of the decoder: random byte mutations of the text and random
// replacements of field values never crash it, and what it accepts is valid.
TEST(DatasetStateJsonTest, MutationFuzz) {
  std::mt19937_64 rng(testing::TestSeed());
  const json good = EncodeDatasetState(Sample());
  const std::string text = good.dump();
  const std::vector<json> values = {nullptr,
                                    -1,
                                    0,
                                    1,
                                    3.5,
                                    "x",
                                    json::array(),
                                    json::object(),
                                    UINT64_MAX,
                                    json::array({1, 2}),
                                    "xxh64:0000000000000000",
                                    true};
  int accepted = 0;
  for (int t = 0; t < 20000; ++t) {
    Result<DatasetState> r = Status();
    if (t % 2 == 0) {
      std::string m = text;
      for (int k = 1 + rng() % 3; k > 0; --k) m[rng() % m.size()] = static_cast<char>(rng() % 128);
      r = DecodeDatasetStateText("m", m);
    } else {
      json j = good;
      auto it = j.begin();
      std::advance(it, rng() % j.size());
      *it = values[rng() % values.size()];
      r = DecodeDatasetState("m", j);
    }
    if (!r.ok()) continue;
    ++accepted;
    ASSERT_GE(r->num_samples, 1u);
    ASSERT_GE(r->global_batch, 1u);
    ASSERT_LE(r->consumed, r->num_samples);
  }
  EXPECT_GT(accepted, 0);
}

TEST(DatasetStateTest, StepBeyondTheEpochIsAnError) {
  DatasetState s = Sample();  // 1000 samples, B = 32: 32 steps, the last of 8 samples
  EXPECT_EQ(s.steps_per_epoch(), 32u);
  auto r = StateAtStep(s, 33);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("step 33 is beyond the end of epoch 2, which has 32 steps"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(StateAtStep(s, 32)->consumed, 1000u);
  EXPECT_EQ(StateAtStep(s, 32)->step(), 32u);
  EXPECT_EQ(StateAtStep(s, 31)->consumed, 992u);
  EXPECT_EQ(StateAtStep(s, 0, 3)->epoch, 3u);
}

class DatasetImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = {.samples = 200, .min_len = 1, .max_len = 30, .vocab = 500, .seed = 1};
    ASSERT_TRUE(WriteSynthDataset(env_, spec_, tmp_ / "d").ok());
    store_ = std::move(Store::Create(env_, tmp_ / "store")).value();
  }
  DatasetImportOptions Options(uint64_t batch = 16) {
    return {.format = DatasetFormat::kMegatron,
            .source = tmp_ / "d",
            .global_batch = batch,
            .seed = 5,
            .length_buckets = {}};
  }
  Env* env_ = Env::Default();
  testing::TempDir tmp_;
  SynthDatasetSpec spec_;
  std::unique_ptr<Store> store_;
};

TEST_F(DatasetImportTest, ImportIntoAnEmptyStoreAndAgain) {
  auto r = ImportDataset(*store_, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->committed);
  EXPECT_EQ(store_->current_generation(), 1u);
  EXPECT_TRUE(store_->current().tensors.empty());
  auto reopened = std::move(Store::Open(env_, tmp_ / "store")).value();
  auto loaded = LoadDatasetState(*reopened);
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ(**loaded, r->state);
  EXPECT_EQ(r->state.num_samples, 200u);
  EXPECT_EQ(r->state.files[0].path, tmp_ / "d.idx");
  // The same dataset with the same settings: nothing changes.
  const auto before = Snapshot(tmp_ / "store");
  auto again = ImportDataset(*store_, Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->committed);
  // Another global batch: refused.
  auto other = ImportDataset(*store_, Options(8));
  EXPECT_EQ(other.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("global batch stays constant"), std::string::npos);
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
}

TEST_F(DatasetImportTest, MismatchedFingerprintChangesNothing) {
  ASSERT_TRUE(ImportDataset(*store_, Options()).ok());
  const auto before = Snapshot(tmp_ / "store");
  // Another dataset of other sizes.
  SynthDatasetSpec other = spec_;
  other.seed = 2;
  ASSERT_TRUE(WriteSynthDataset(env_, other, tmp_ / "d").ok());
  auto r = ImportDataset(*store_, Options());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("dataset fingerprint mismatch"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("nothing was changed"), std::string::npos);
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
  // Opening the source for a view notices too.
  auto state = **LoadDatasetState(*store_);
  EXPECT_NE(OpenDatasetSource(env_, *store_, state).status().message().find("fingerprint mismatch"), std::string::npos);
}

// Same file sizes, other index content: caught by the checksum.
TEST_F(DatasetImportTest, SameSizesOtherIndexIsCaught) {
  ASSERT_TRUE(ImportDataset(*store_, Options()).ok());
  std::string idx = *ReadFileToString(env_, tmp_ / "d.idx");
  int32_t l0, l1;
  std::memcpy(&l0, &idx[34], 4);
  std::memcpy(&l1, &idx[38], 4);
  std::memcpy(&idx[34], &l1, 4);
  std::memcpy(&idx[38], &l0, 4);
  const int64_t p1 = 2 * l1;  // u16 tokens: sequence 1 now starts after l1 tokens
  std::memcpy(&idx[34 + 4 * 200 + 8], &p1, 8);
  ASSERT_NE(l0, l1);
  ASSERT_TRUE(WriteFileAtomic(env_, tmp_ / "d.idx", idx).ok());
  const auto before = Snapshot(tmp_ / "store");
  auto r = ImportDataset(*store_, Options());
  EXPECT_NE(r.status().message().find("dataset fingerprint mismatch"), std::string::npos) << r.status().message();
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
  auto state = **LoadDatasetState(*store_);
  EXPECT_NE(OpenDatasetSource(env_, *store_, state).status().message().find("checksum"), std::string::npos);
}

TEST_F(DatasetImportTest, BadSourcesAreRejected) {
  const auto before = Snapshot(tmp_ / "store");
  std::string idx = *ReadFileToString(env_, tmp_ / "d.idx");
  ASSERT_TRUE(WriteFileAtomic(env_, tmp_ / "t.idx", idx.substr(0, idx.size() - 5)).ok());
  fs::copy_file(tmp_ / "d.bin", tmp_ / "t.bin");
  auto o = Options();
  o.source = tmp_ / "t";
  EXPECT_NE(ImportDataset(*store_, o).status().message().find("t.idx: truncated or count mismatch"), std::string::npos);
  o.source = tmp_ / "missing";
  EXPECT_EQ(ImportDataset(*store_, o).status().code(), Code::kNotFound);
  o = Options(0);
  EXPECT_NE(ImportDataset(*store_, o).status().message().find("--global-batch"), std::string::npos);
  o = Options();
  o.length_buckets = {10, 5};
  EXPECT_NE(ImportDataset(*store_, o).status().message().find("strictly ascending"), std::string::npos);
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
}

TEST_F(DatasetImportTest, KeepsTheModelGeneration) {
  ModelSpec spec = testing::Spec("megatron-gpt", "layers=2,hidden=16,heads=2,vocab=64,seq=8");
  ParallelConfig config = *ParseConfig("tp=2,pp=1,dp=1");
  ASSERT_TRUE(WriteSynthCheckpoint(env_, ptc::testing::FitLayout(spec, config), 1, tmp_ / "ckpt").ok());
  auto imported = ImportCheckpoint(env_, tmp_ / "ckpt", tmp_ / "model", spec.schema, spec.dims, config);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto store = std::move(Store::Open(env_, tmp_ / "model")).value();
  const GenerationManifest before = store->current();
  auto r = ImportDataset(*store, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const GenerationManifest& after = store->current();
  EXPECT_EQ(after.generation, before.generation + 1);
  EXPECT_EQ(after.tensors, before.tensors);
  EXPECT_EQ(after.shards, before.shards);  // same files, in the older generation directory
  EXPECT_EQ(after.config, before.config);
  EXPECT_TRUE(after.extra.contains("dataset"));
  EXPECT_TRUE(VerifyGeneration(*store, after).ok());
}

TEST_F(DatasetImportTest, AdvanceCommitsAPosition) {
  ASSERT_TRUE(ImportDataset(*store_, Options()).ok());
  DatasetState s = **LoadDatasetState(*store_);
  const auto before = Snapshot(tmp_ / "store");
  EXPECT_FALSE(StateAtStep(s, 14).ok());  // 200 / 16: 13 steps
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
  ASSERT_TRUE(CommitDatasetState(*store_, *StateAtStep(s, 5)).ok());
  EXPECT_EQ((**LoadDatasetState(*store_)).consumed, 80u);
  EXPECT_EQ(store_->current_generation(), 2u);
}

// Every single failed write during an import leaves the store as it was.
TEST_F(DatasetImportTest, InjectedFaultsChangeNothing) {
  FaultInjectionEnv faulty(env_);
  auto store = std::move(Store::Open(&faulty, tmp_ / "store")).value();
  const auto before = Snapshot(tmp_ / "store");
  for (int k = 0;; ++k) {
    faulty.FailOnceAfter(k);
    auto r = ImportDataset(*store, Options());
    faulty.Disarm();
    if (r.ok()) break;
    ASSERT_LT(k, 100);
    if (r.status().message().find("committed but not durable") != std::string::npos) break;  // the commit point
    store = std::move(Store::Open(env_, tmp_ / "store")).value();
    EXPECT_FALSE(store->has_generation()) << "fault " << k;
    EXPECT_EQ(Snapshot(tmp_ / "store"), before) << "fault " << k << ": " << r.status().ToString();
    store = std::move(Store::Open(&faulty, tmp_ / "store")).value();
  }
  EXPECT_TRUE((*LoadDatasetState(*store)).has_value());
}

TEST_F(DatasetImportTest, JsonlImport) {
  const std::string text = "{\"t\":\"a\"}\n{\"t\":\"b\"}\n\n{\"t\":\"c\"}\n";
  ASSERT_TRUE(WriteFileAtomic(env_, tmp_ / "x.jsonl", text).ok());
  DatasetImportOptions o{
      .format = DatasetFormat::kJsonl, .source = tmp_ / "x.jsonl", .global_batch = 2, .seed = 0, .length_buckets = {}};
  o.length_buckets = {10};
  EXPECT_NE(ImportDataset(*store_, o).status().message().find("only megatron"), std::string::npos);
  const auto empty = Snapshot(tmp_ / "store");
  ASSERT_TRUE(WriteFileAtomic(env_, tmp_ / "e.jsonl", "\n\n").ok());
  DatasetImportOptions e{
      .format = DatasetFormat::kJsonl, .source = tmp_ / "e.jsonl", .global_batch = 2, .seed = 0, .length_buckets = {}};
  EXPECT_NE(ImportDataset(*store_, e).status().message().find("no samples"), std::string::npos);
  EXPECT_EQ(Snapshot(tmp_ / "store"), empty);
  o.length_buckets.clear();
  auto r = ImportDataset(*store_, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state.num_samples, 3u);
  EXPECT_EQ(r->state.index.rfind("dataset/jsonl-", 0), 0u);
  EXPECT_TRUE(env_->Exists(store_->AbsPath(r->state.index)));
  EXPECT_TRUE(OpenDatasetSource(env_, *store_, r->state).ok());
  const auto before = Snapshot(tmp_ / "store");
  ASSERT_TRUE(WriteFileAtomic(env_, tmp_ / "x.jsonl", text + "{\"t\":\"d\"}\n").ok());
  EXPECT_NE(ImportDataset(*store_, o).status().message().find("fingerprint mismatch"), std::string::npos);
  EXPECT_EQ(Snapshot(tmp_ / "store"), before);
}

}  // namespace
}  // namespace ptc
