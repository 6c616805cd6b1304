// Hostile and broken inputs (issue 12): tensor names that try to climb out of
// an export directory, stores that hold only a dataset, stores that cannot be
// served, negative numbers and usage errors. Each bad input gets a message
// naming the file, tensor or rule at fault, and changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/format/safetensors.h"
#include "ptc/format/torch_file.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"
#include "ptc/model/tensor_name.h"
#include "ptc/store/manifest.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store.h"
#include "test_util.h"
#include "view/export.h"
#include "view/megatron_file.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";

// --- item 3: tensor names --------------------------------------------------

TEST(TensorName, RejectsNamesThatAreNotOneFileName) {
  for (const std::string& bad : {std::string(""), std::string("."), std::string(".."), std::string("../evil"),
                                 std::string("a/b"), std::string("/abs"), std::string("x\x01y"), std::string("x\x7f"),
                                 std::string("nul\0in", 6), std::string(kMaxTensorNameBytes + 1, 'a')}) {
    Status s = ValidateTensorName(bad, "here");
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << EscapeName(bad);
    EXPECT_TRUE(s.message().starts_with("here: tensor name '")) << s.message();
  }
  for (const std::string good : {"layers.0.weight", "a..b", ".hidden", "x.exp_avg_sq"}) {
    EXPECT_TRUE(ValidateTensorName(good, "here").ok()) << good;
  }
  EXPECT_TRUE(ValidateTensorName(std::string(kMaxTensorNameBytes, 'a'), "here").ok());
  EXPECT_FALSE(ValidateLeafName("dir", "../x.npy").ok());
  EXPECT_FALSE(ValidateLeafName("dir", "..").ok());
  EXPECT_TRUE(ValidateLeafName("dir", "..npy").ok());
}

TEST(TensorName, SchemaRejectsHostileRuleNames) {
  for (const std::string& bad :
       {std::string("../../escape"), std::string("a/b.{i}"), std::string("."), std::string(".."),
        std::string("tab\there"), std::string("{i}/.."), std::string(300, 'x')}) {
    nlohmann::json doc = {{"tensors", {{{"name", bad}, {"shape", {"hidden"}}, {"pp", "first"}}}}};
    if (bad.find("{i}") != std::string::npos) doc["tensors"][0]["pp"] = "layer";
    auto s = ParseSchema("my.json", doc);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().message().starts_with("my.json: tensors[0]")) << s.status().message();
  }
  nlohmann::json good = {{"tensors", {{{"name", "layers.{i}.w"}, {"shape", {"hidden"}}}}}};
  EXPECT_TRUE(ParseSchema("my.json", good).ok());
}

// Found by text_fuzz (tests/fuzz/corpus/text_fuzz/regression-schema-pp-not-a-string):
// a rule whose "pp" is not a string threw out of ParseSchema.
TEST(Schema, PlacementThatIsNotAStringIsAnError) {
  for (const nlohmann::json& pp : {nlohmann::json::object({{"dim", 2}}), nlohmann::json(5), nlohmann::json(nullptr)}) {
    nlohmann::json doc = {{"tensors", {{{"name", "layers.{i}.w"}, {"shape", {"hidden"}}, {"pp", pp}}}}};
    auto s = ParseSchema("my.json", doc);
    ASSERT_FALSE(s.ok()) << pp.dump();
    EXPECT_TRUE(s.status().message().ends_with("pp must be a string")) << s.status().message();
  }
}

class HostileCliTest : public ::testing::Test {
 protected:
  // A store of `optimizer` (adam or none) in tp=2,pp=2.
  void MakeStore(const std::string& optimizer = "none") {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 --optimizer " +
                   optimizer + " " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 " + tmp_ / "ckpt" +
              " " + tmp_ / "store");
    ASSERT_EQ(r.first, 0) << r.second;
  }
  std::string ManifestPath() { return tmp_ / "store/gen-000001/manifest.json"; }
  nlohmann::json Manifest() { return nlohmann::json::parse(Slurp(ManifestPath())); }
  void WriteManifest(const nlohmann::json& m) { Spit(ManifestPath(), m.dump(2)); }

  TempDir tmp_;
};

TEST_F(HostileCliTest, ManifestTensorNameCannotClimbOutOfExport) {
  MakeStore();
  // Rename one first-stage tensor everywhere in the manifest (schema rule,
  // tensor table, shards) to a name that climbs out of OUT_DIR.
  nlohmann::json m = Manifest();
  std::string name;
  for (const auto& rule : m["schema"]["tensors"]) {
    if (rule["pp"] == "first" && !rule.contains("tied_to")) name = rule["name"];
  }
  ASSERT_FALSE(name.empty());
  std::string text = Slurp(ManifestPath());
  const std::string from = "\"" + name + "\"", to = "\"../../../../escape\"";  // out/rank-00000/tensors/ -> deep/
  for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), to);
  Spit(ManifestPath(), text);
  const auto before = Snapshot(tmp_.path());
  fs::create_directories(tmp_ / "deep/er");
  auto r = Ptcfs("export --format npy --config tp=1,pp=1 " + tmp_ / "store " + tmp_ / "deep/er/out");
  EXPECT_NE(r.first, 0) << r.second;
  EXPECT_TRUE(Contains(r.second, "'../../../../escape'")) << r.second;
  EXPECT_TRUE(Contains(r.second, "manifest.json")) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "deep/escape.npy"));
  EXPECT_FALSE(fs::exists(tmp_ / "deep/er/out"));
  fs::remove_all(tmp_ / "deep");
  EXPECT_TRUE(Snapshot(tmp_.path()) == before) << "something changed";
}

TEST_F(HostileCliTest, SchemaFileWithClimbingNameIsRefused) {
  auto schema = nlohmann::json::parse(Ptcfs("schema megatron-gpt 2>/dev/null").second, nullptr, false);
  ASSERT_FALSE(schema.is_discarded());
  for (auto& rule : schema["tensors"]) {
    if (rule["pp"] == "first" && !rule.contains("tied_to")) {
      rule["name"] = "../x";
      break;
    }
  }
  Spit(tmp_ / "s.json", schema.dump());
  auto r =
      Ptcfs("synth --schema " + tmp_ / "s.json" + " --dims " + std::string(kDims) + " --config tp=1 " + tmp_ / "ckpt");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "s.json: tensors[")) << r.second;
  EXPECT_TRUE(Contains(r.second, "'../x' contains '/'")) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "ckpt"));
  EXPECT_FALSE(fs::exists(tmp_ / "x.npy"));
}

TEST_F(HostileCliTest, SafetensorsTensorNameWithSlashIsNamed) {
  auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=1 " + tmp_ / "ckpt");
  ASSERT_EQ(r.first, 0) << r.second;
  const std::string path = ModelFilePath(tmp_ / "ckpt", 0);
  std::string bytes = Slurp(path);
  auto header = ReadSafetensorsHeader(Env::Default(), path);
  ASSERT_TRUE(header.ok());
  const std::string name = header->tensors.back().name;
  const std::string evil = std::string(name.size() - 3, 'a') + "/..";  // same length: offsets stay
  bytes.replace(bytes.find("\"" + name + "\""), name.size() + 2, "\"" + evil + "\"");
  Spit(path, bytes);
  r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=1 " + tmp_ / "ckpt " +
            tmp_ / "store");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, path + ": tensor name '" + evil + "' contains '/'")) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "store"));
}

TEST(TensorName, ManifestDecodeRejectsHostileNames) {
  GenerationManifest m;
  m.generation = 1;
  m.tensors.push_back({"../up", DType::kF32, {4}});
  auto r = DecodeManifest("gen-000001/manifest.json", EncodeManifest(m));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), "gen-000001/manifest.json: tensor 0")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "'../up'")) << r.status().message();
}

// --- item 5: a store that holds only a dataset ------------------------------

TEST_F(HostileCliTest, DatasetOnlyStoreIsDescribedNotAborted) {
  auto r = Ptcfs("data synth --samples 50 --min-len 4 --max-len 16 --vocab 100 " + tmp_ / "ds");
  ASSERT_EQ(r.first, 0) << r.second;
  r = Ptcfs("data import --format megatron " + tmp_ / "ds " + tmp_ / "store --global-batch 4");
  ASSERT_EQ(r.first, 0) << r.second;
  const auto before = Snapshot(tmp_ / "store");
  r = Ptcfs("inspect " + tmp_ / "store");
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_TRUE(
      Contains(r.second, tmp_ / "store: generation 1 holds a dataset but no tensors (import a checkpoint first)"))
      << r.second;
  r = Ptcfs("inspect --json " + tmp_ / "store");
  EXPECT_EQ(r.first, 0) << r.second;
  r = Ptcfs("export --config tp=1 " + tmp_ / "store " + tmp_ / "out");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(
      Contains(r.second, tmp_ / "store: generation 1 holds a dataset but no tensors (import a checkpoint first)"))
      << r.second;
  EXPECT_FALSE(Contains(r.second, "a schema is an object")) << r.second;
  r = Ptcfs("plan " + tmp_ / "store --to tp=2");
  EXPECT_NE(r.first, 0) << r.second;
  EXPECT_TRUE(
      Contains(r.second, tmp_ / "store: generation 1 holds a dataset but no tensors (import a checkpoint first)"))
      << r.second;
  r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_TRUE(Snapshot(tmp_ / "store") == before);
}

// --- item 7: verify checks that the store can be served ---------------------

TEST_F(HostileCliTest, VerifyFindsAMissingShardRecord) {
  MakeStore();
  nlohmann::json m = Manifest();
  const std::string tensor = m["shards"][3]["tensor"];
  m["shards"].erase(3);
  WriteManifest(m);
  auto r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, "tensor '" + tensor + "': no shard on worker 0 holds")) << r.second;
  EXPECT_TRUE(Contains(r.second, "cannot be served")) << r.second;
}

TEST_F(HostileCliTest, VerifyFindsEditedDims) {
  MakeStore();
  nlohmann::json m = Manifest();
  m["dims"] = "layers=4,hidden=64,heads=4,vocab=128,seq=16";
  WriteManifest(m);
  auto r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, "shape [")) << r.second;
  EXPECT_TRUE(Contains(r.second, "hidden=64")) << r.second;
}

TEST_F(HostileCliTest, VerifyFindsABadConfigLabel) {
  MakeStore();
  nlohmann::json m = Manifest();
  m["config"] = "tp=0,pp=2,dp=1";
  WriteManifest(m);
  auto r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_NE(r.first, 0) << r.second;
  EXPECT_TRUE(Contains(r.second, "tp=0")) << r.second;
  EXPECT_FALSE(Contains(r.second, " OK")) << r.second;
  m["config"] = "tp=3,pp=2,dp=1";  // parses, does not divide the model
  WriteManifest(m);
  r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, "config 'tp=3")) << r.second;
}

TEST_F(HostileCliTest, VerifyOfAGoodStoreIsQuietAndOk) {
  MakeStore("adam");
  auto r = Sh("PTCFS_PROGRESS=1 " + std::string(PTCFS_BINARY) + " verify " + tmp_ / "store" + " 2>&1 >/dev/null");
  EXPECT_EQ(r.first, 0) << r.second;
  // Corrupt one shard: the error is not preceded by a blank line.
  nlohmann::json m = Manifest();
  const std::string file = tmp_ / "store" + "/" + m["shards"][0]["file"].get<std::string>();
  std::string bytes = Slurp(file);
  bytes[m["shards"][0]["offset"].get<size_t>()] ^= 1;
  Spit(file, bytes);
  r = Sh(std::string(PTCFS_BINARY) + " verify " + tmp_ / "store" + " 2>&1 >/dev/null");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs verify: ")) << "[" << r.second << "]";
}

// --- item 4: out of space ---------------------------------------------------

// A 3 MiB tmpfs, unmounted (lazily) whatever happens.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir_);
    mounted_ = Sh("mount -t tmpfs -o size=3m tmpfs " + dir_).first == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) (void)Sh("umount " + dir_ + " || umount -l " + dir_);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

std::map<std::string, std::string> StoreFiles(const std::string& dir) {
  auto files = Snapshot(dir);
  files.erase("lock");  // the writer lock may be created by a writer
  return files;
}

// ENOSPC anywhere in a write of tensor bytes (HDF5 creating or closing a
// shard file, or the shard's data; a compact writes them, a transform on one
// worker only references pieces): one line naming the file and the error,
// exit 1, no crash in HDF5's shutdown, the store unchanged.
TEST_F(HostileCliTest, OutOfSpaceIsOneLineAndChangesNothing) {
  SmallTmpfs small(tmp_ / "small");
  if (!small.mounted()) {
    if (InCi()) FAIL() << "cannot mount a tmpfs (needs root); under CI this test may not skip";
    GTEST_SKIP() << "cannot mount a tmpfs (needs root)";
  }
  const std::string dims = "layers=4,hidden=64,heads=4,vocab=1024,seq=64";
  auto r = Ptcfs("synth --schema megatron-gpt --dims " + dims + " --config tp=2 " + tmp_ / "ckpt");
  ASSERT_EQ(r.first, 0) << r.second;
  const std::string store = tmp_ / "small/store";
  r = Ptcfs("import --schema megatron-gpt --dims " + dims + " --config tp=2 " + tmp_ / "ckpt " + store);
  ASSERT_EQ(r.first, 0) << r.second;
  r = Ptcfs("transform " + store + " --to tp=1");  // a covering of the tp=2 pieces
  ASSERT_EQ(r.first, 0) << r.second;
  const auto before = StoreFiles(store);
  // Fillers that leave room for different amounts of the new generation, so
  // that the space runs out in H5Fcreate, H5Fclose or a data write.
  for (int filler_kib : {100, 200, 300, 600, 1100}) {
    Spit(tmp_ / "small/filler", std::string(filler_kib * 1024, '\0'));
    for (int threads : {1, 2, 4}) {
      const std::string what = "filler " + std::to_string(filler_kib) + " KiB, " + std::to_string(threads) + " threads";
      r = Ptcfs("compact " + store + " --threads " + std::to_string(threads));
      EXPECT_EQ(r.first, 1) << what << ": " << r.second;
      EXPECT_TRUE(r.second.starts_with("ptcfs compact: " + store + "/")) << what << ": " << r.second;
      EXPECT_TRUE(Contains(r.second, ": No space left on device\n")) << what << ": " << r.second;
      EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << what << ": " << r.second;
      EXPECT_TRUE(StoreFiles(store) == before) << what << ": the store changed";
    }
  }
}

// --- item 9 ---------------------------------------------------------------

TEST_F(HostileCliTest, NegativeNumbersAreRefused) {
  auto r = Ptcfs("data synth --samples 50 --min-len 4 --max-len 16 --vocab 100 " + tmp_ / "ds");
  ASSERT_EQ(r.first, 0) << r.second;
  r = Ptcfs("data import --format megatron " + tmp_ / "ds " + tmp_ / "store --global-batch -1");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "--global-batch")) << r.second;
  EXPECT_TRUE(Contains(r.second, "must not be negative")) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "store"));
  r = Ptcfs("data import --format megatron " + tmp_ / "ds " + tmp_ / "store --global-batch 4");
  ASSERT_EQ(r.first, 0) << r.second;
  const auto before = Snapshot(tmp_ / "store");
  for (const std::string args : {"--step -1", "--step 1 --epoch -1", "--step -0"}) {
    r = Ptcfs("data advance " + tmp_ / "store " + args);
    EXPECT_EQ(r.first, 2) << args << ": " << r.second;
    EXPECT_TRUE(Contains(r.second, "must not be negative")) << r.second;
    EXPECT_FALSE(Contains(r.second, "18446744073709551615")) << r.second;
  }
  EXPECT_TRUE(Snapshot(tmp_ / "store") == before);
}

TEST(HostileCli, UsageErrorsExit2) {
  for (const std::string args : {"", "bogus", "export", "export --config", "inspect --no-such-flag x",
                                 "export --format zip --config tp=1 a b", "data advance x --step abc"}) {
    auto r = Ptcfs(args);
    EXPECT_EQ(r.first, 2) << args << ": " << r.second;
  }
  EXPECT_EQ(Ptcfs("--help").first, 0);
  EXPECT_EQ(Ptcfs("export --help").first, 0);
}

// A rank-0 file whose first tensor alone has another dtype: the message names
// that tensor and that file, not every other tensor.
TEST_F(HostileCliTest, DtypeMismatchBlamesTheRightTensor) {
  auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2 " + tmp_ / "ckpt");
  ASSERT_EQ(r.first, 0) << r.second;
  for (int rank : {0, 1}) {
    const std::string path = ModelFilePath(tmp_ / "ckpt", rank);
    auto header = ReadSafetensorsHeader(Env::Default(), path);
    ASSERT_TRUE(header.ok());
    const std::string name = header->tensors.front().name;  // data order: the first tensor
    std::string bytes = Slurp(path);
    const uint64_t n = header->data_start - 8;
    auto j = nlohmann::json::parse(bytes.substr(8, n));
    ASSERT_EQ(j[name]["dtype"], "F32");
    j[name]["dtype"] = "I32";  // same size, offsets stay
    std::string text = j.dump();
    text.resize(n, ' ');
    ASSERT_EQ(text.size(), n);
    Spit(path, bytes.substr(0, 8) + text + bytes.substr(8 + n));
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2 " + tmp_ / "ckpt " +
              tmp_ / "store");
    EXPECT_EQ(r.first, 2) << r.second;
    EXPECT_TRUE(Contains(r.second, path + ": tensor '" + name + "' has dtype I32, expected F32")) << r.second;
    EXPECT_FALSE(fs::exists(tmp_ / "store"));
    fs::remove_all(tmp_ / "ckpt");
    ASSERT_EQ(
        Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2 " + tmp_ / "ckpt").first, 0);
  }
}

// The same for a Megatron tree: the first model tensor of mp_rank_00 alone is
// I32 (its storage rewritten as an IntStorage of the same bytes).
TEST_F(HostileCliTest, MegatronDtypeMismatchBlamesTheRightTensor) {
  MakeStore();
  auto r = Ptcfs("export --format megatron --config tp=2,pp=2 " + tmp_ / "store " + tmp_ / "meg");
  ASSERT_EQ(r.first, 0) << r.second;
  std::string path;
  for (const auto& e : fs::recursive_directory_iterator(tmp_ / "meg")) {
    if (e.path().filename() == "model_optim_rng.pt" && e.path().parent_path().filename() == "mp_rank_00_000")
      path = e.path().string();
  }
  ASSERT_FALSE(path.empty());
  Env* env = Env::Default();
  std::string key;
  {
    auto file = env->OpenRead(path);
    ASSERT_TRUE(file.ok());
    auto tf = ReadTorchFile(**file, path);
    ASSERT_TRUE(tf.ok()) << tf.status().message();
    auto schema = LoadSchema("megatron-gpt");
    auto dims = ParseDims(kDims);
    auto config = ParseConfig("tp=2,pp=2");
    ASSERT_TRUE(schema.ok() && dims.ok() && config.ok());
    auto view = LayoutView(ModelSpec{*schema, *dims, DType::kF32, false}, *config, 0);
    ASSERT_TRUE(view.ok());
    const std::string name = view->model[0].name;
    const pickle::Value* v = &tf->root;
    for (const std::string& k : megatron::ModelKeyPath("megatron-gpt", name)) v = v ? v->Find(k) : nullptr;
    ASSERT_TRUE(v != nullptr && v->is_tensor()) << name;
    key = v->tensor().storage_key;
    pickle::ForEachTensor(tf->root, [&](const std::string&, pickle::Tensor& t) {
      if (t.storage_key == key) t.dtype = DType::kI32;
    });
    std::vector<TorchStorageSpec> specs;
    for (const TorchStorage& st : tf->storages) {
      specs.push_back({st.key, st.key == key ? DType::kI32 : st.dtype, st.numel});
    }
    auto out = env->OpenWrite(path + ".new");
    ASSERT_TRUE(out.ok());
    const RandomAccessFile& in = **file;
    Status w = WriteTorchFile(
        **out, tf->archive, tf->root, specs,
        [&](size_t i, uint64_t offset, size_t n, void* dst) {
          return in.Read(tf->storages[i].member.data_offset + offset, n, dst);
        },
        path);
    ASSERT_TRUE(w.ok()) << w.message();
    ASSERT_TRUE((*out)->Close().ok());
    key.clear();  // the tensor as the file names it: its key path
    for (const std::string& k : megatron::ModelKeyPath("megatron-gpt", name)) key += (key.empty() ? "" : "/") + k;
  }
  fs::rename(path + ".new", path);
  r = Ptcfs("import --format megatron --schema megatron-gpt --dims " + std::string(kDims) + " " + tmp_ / "meg " +
            tmp_ / "store2");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, path)) << r.second;
  EXPECT_TRUE(Contains(r.second, key)) << key << ": " << r.second;
  EXPECT_TRUE(Contains(r.second, "dtype I32, the schema says F32")) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "store2"));
}

// --- output files: created in their directory, never through a link -------

// Export and synth check that OUT is empty, then write: a link planted in OUT
// in between (or by a caller that skips the check) must not be followed. Each
// write fails naming the link, and what the link points to stays as it was.
TEST_F(HostileCliTest, OutputTreesDoNotFollowPlantedLinks) {
  const ModelSpec spec = Spec("megatron-gpt", kDims);
  const ParallelConfig config = ParseConfig("tp=2,pp=1").value();
  Spit(tmp_ / "victim", "victim");
  fs::create_directories(tmp_ / "elsewhere");
  const auto untouched = [&] {
    EXPECT_TRUE(Slurp(tmp_ / "victim") == "victim") << "written through a file link";
    EXPECT_TRUE(fs::is_empty(tmp_ / "elsewhere")) << "written through a directory link";
  };
  // A file link: OUT/rank-00000/model.safetensors -> victim.
  fs::create_directories(tmp_ / "out1/rank-00000");
  fs::create_symlink(tmp_ / "victim", tmp_ / "out1/rank-00000/model.safetensors");
  Status s = WriteSynthCheckpoint(Env::Default(), ptc::testing::FitLayout(spec, config), 1, tmp_ / "out1");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), tmp_ / "out1/rank-00000/model.safetensors: a symbolic link")) << s.message();
  untouched();
  // A directory link: OUT/rank-00001 -> elsewhere.
  fs::create_directories(tmp_ / "out2");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "out2/rank-00001");
  s = WriteSynthCheckpoint(Env::Default(), ptc::testing::FitLayout(spec, config), 1, tmp_ / "out2");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), tmp_ / "out2/rank-00001: a symbolic link")) << s.message();
  untouched();
  // npy: OUT/rank-00000/tensors -> elsewhere, and the temporary of dtypes.json -> victim.
  auto view = LayoutView(spec, config, 0);
  ASSERT_TRUE(view.ok());
  const auto zeros = [](const LocalTensor&, void*) { return Status::OK(); };
  fs::create_directories(tmp_ / "out3/rank-00000");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "out3/rank-00000/tensors");
  s = WriteRankCheckpoint(Env::Default(), tmp_ / "out3", config, *view, zeros, {}, CheckpointFormat::kNpy);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), tmp_ / "out3/rank-00000/tensors: a symbolic link")) << s.message();
  untouched();
  fs::create_directories(tmp_ / "out4/rank-00000/tensors");
  fs::create_symlink(tmp_ / "victim", tmp_ / "out4/rank-00000/tensors/dtypes.json.tmp");
  s = WriteRankCheckpoint(Env::Default(), tmp_ / "out4", config, *view, zeros, {}, CheckpointFormat::kNpy);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), tmp_ / "out4/rank-00000/tensors/dtypes.json.tmp: a symbolic link")) << s.message();
  untouched();
  // Megatron: OUT/iter_0000000 -> elsewhere.
  MakeStore();
  auto store = Store::Open(Env::Default(), tmp_ / "store");
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto stored = SpecFromManifest((*store)->current());
  ASSERT_TRUE(stored.ok());
  fs::create_directories(tmp_ / "out5");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "out5/iter_0000000");
  s = ptcfs::ExportMegatron(Env::Default(), **store, (*store)->CurrentSnapshot(),
                            FitLayout(*stored, ParseConfig("tp=2,pp=2").value()), tmp_ / "out5");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), tmp_ / "out5/iter_0000000: a symbolic link")) << s.message();
  untouched();
}

}  // namespace
}  // namespace ptc
