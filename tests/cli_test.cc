// The `ptcfs` command line end to end: every listed bad input gives a clear
// message (asserted) and leaves the store byte-for-byte unchanged (asserted
// by snapshotting every file of the store before and after).
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/format/safetensors.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) +
                   " --config tp=2,pp=2,dp=2 --optimizer adam " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2,dp=2 " +
              tmp_ / "ckpt" + " " + tmp_ / "store");
    ASSERT_EQ(r.first, 0) << r.second;
    before_ = Snapshot(tmp_ / "store");
    // A second checkpoint to damage; the store must not change when it is imported.
    fs::copy(tmp_ / "ckpt", tmp_ / "bad", fs::copy_options::recursive);
  }

  std::pair<int, std::string> ImportBad(const std::string& config = "tp=2,pp=2,dp=2") {
    return Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config " + config + " " +
                 tmp_ / "bad" + " " + tmp_ / "store");
  }

  void ExpectStoreUnchanged() { EXPECT_TRUE(Snapshot(tmp_ / "store") == before_) << "the store changed"; }

  TempDir tmp_;
  std::map<std::string, std::string> before_;
};

TEST_F(CliTest, HelpTeaches) {
  auto r = Ptcfs("--help");
  EXPECT_EQ(r.first, 0);
  for (const char* cmd : {"synth", "import", "export", "inspect", "verify", "diff"}) {
    EXPECT_NE(r.second.find(cmd), std::string::npos) << cmd;
  }
  r = Ptcfs("export --help");
  EXPECT_NE(r.second.find("--config"), std::string::npos);
  EXPECT_NE(r.second.find("npy"), std::string::npos);
  // --names says what each set names and that it numbers the optimizer state.
  for (const char* cmd : {"export --help", "mount --help"}) {
    r = Ptcfs(cmd);
    EXPECT_EQ(r.first, 0) << cmd;
    for (const char* part :
         {"--names", "linear_qkv.layer_norm_weight", "input_layernorm.weight", "numbers the optimizer state"}) {
      EXPECT_TRUE(Contains(r.second, part)) << cmd << ": " << part << "\n" << r.second;
    }
  }
}

// Megatron-Core's two name sets (docs/megatron_format.md): a llama store exported in local
// names imports again (recognised from the files) and exports in te names to the bytes the
// store's own te export has; --names outside --format megatron is refused before anything.
TEST_F(CliTest, MegatronNameSetsRoundTrip) {
  const std::string model = "--schema llama --dims layers=4,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16";
  auto run = [&](const std::string& args) {
    auto r = Ptcfs(args);
    ASSERT_EQ(r.first, 0) << args << "\n" << r.second;
  };
  run("synth " + model + " --optimizer adam --config tp=2,pp=2 " + tmp_ / "llama");
  run("import " + model + " --config tp=2,pp=2 " + tmp_ / "llama " + tmp_ / "lstore");
  run("export --format megatron --names local --config tp=2,pp=2 " + tmp_ / "lstore " + tmp_ / "local");
  run("export --format megatron --config tp=1,pp=2 " + tmp_ / "lstore " + tmp_ / "te");
  const std::string file = Slurp(tmp_ / "local/iter_0000000/mp_rank_01_001/model_optim_rng.pt");
  EXPECT_TRUE(Contains(file, "decoder.layers.1.input_layernorm.weight"));
  EXPECT_FALSE(Contains(file, "layer_norm_weight"));
  run("import --format megatron " + model + " " + tmp_ / "local " + tmp_ / "again");
  run("export --format megatron --names te --config tp=1,pp=2 " + tmp_ / "again " + tmp_ / "te-again");
  EXPECT_EQ(Snapshot(tmp_ / "te-again"), Snapshot(tmp_ / "te"));
  auto r = Ptcfs("export --names local --config tp=1 " + tmp_ / "store " + tmp_ / "out");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "--names local: names the tensors of --format megatron only")) << r.second;
  r = Ptcfs("export --format megatron --names tE --config tp=1 " + tmp_ / "store " + tmp_ / "out");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "out"));
  r = Ptcfs("mount --names local " + tmp_ / "store " + tmp_ / "nowhere");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "--names local: names the files of megatron/ (--format megatron or all)")) << r.second;
  ExpectStoreUnchanged();
}

// --rank-file-copies is checked as it is parsed: a usage error, the store untouched.
TEST_F(CliTest, RankFileCopiesIsCheckedAsParsed) {
  for (const std::string& cmd : {"compact --rank-files --rank-file-copies 12Q " + tmp_ / "store",
                                "mount --rank-file-copies -1 " + tmp_ / "store " + tmp_ / "nowhere"}) {
    auto r = Ptcfs(cmd);
    EXPECT_EQ(r.first, 2) << cmd << ": " << r.second;
    EXPECT_TRUE(Contains(r.second, "expected all, none, stored or a byte count (K, M, G, T suffixes)")) << r.second;
  }
  ExpectStoreUnchanged();
}

TEST_F(CliTest, ImportExportVerifyInspectDiff) {
  auto r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 0) << r.second;
  r = Ptcfs("inspect --json " + tmp_ / "store");
  ASSERT_EQ(r.first, 0) << r.second;
  auto j = nlohmann::json::parse(r.second);
  EXPECT_EQ(j["generation"], 1);
  EXPECT_EQ(j["config"], "tp=2,pp=2,dp=2,per_worker=8");
  EXPECT_EQ(j["model"]["optimizer"], true);
  r = Ptcfs("export --config tp=4,pp=1,dp=1,zero=1 " + tmp_ / "store" + " " + tmp_ / "out");
  ASSERT_EQ(r.first, 0) << r.second;
  r = Ptcfs("diff --schema megatron-gpt --dims " + std::string(kDims) + " --config-a tp=2,pp=2,dp=2 --config-b " +
            "tp=4,pp=1,dp=1,zero=1 " + tmp_ / "ckpt" + " " + tmp_ / "out");
  EXPECT_EQ(r.first, 0) << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, DiffNamesTheFirstDifferingTensorAndElement) {
  // Flip one byte of a tensor present once (tp split, dp=2 replica 0 and 1
  // both hold it: flip it in both so the checkpoint stays self-consistent).
  const std::string tensor = "language_model.encoder.layers.1.mlp.dense_4h_to_h.weight";
  for (int rank : {0, 2}) {  // tp=0, dp=0 and dp=1 of stage 0
    const std::string path = ModelFilePath(tmp_ / "bad", rank);
    auto header = ReadSafetensorsHeader(Env::Default(), path);
    ASSERT_TRUE(header.ok());
    std::string bytes = Slurp(path);
    bytes[header->Find(tensor)->offset + 4 * 5] ^= 0x01;  // row 0, column 5 (F32)
    Spit(path, bytes);
  }
  auto r = Ptcfs("diff --schema megatron-gpt --dims " + std::string(kDims) +
                 " --config-a tp=2,pp=2,dp=2 --config-b tp=2,pp=2,dp=2 " + tmp_ / "ckpt" + " " + tmp_ / "bad");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find("'" + tensor + "' differs at [0, 5]"), std::string::npos) << r.second;
  // Only one replica changed: the replicas inside B disagree.
  Spit(ModelFilePath(tmp_ / "bad", 2), Slurp(ModelFilePath(tmp_ / "ckpt", 2)));
  r = Ptcfs("diff --schema megatron-gpt --dims " + std::string(kDims) +
            " --config-a tp=2,pp=2,dp=2 --config-b tp=2,pp=2,dp=2 " + tmp_ / "ckpt" + " " + tmp_ / "bad");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find("replicas of '" + tensor + "' disagree"), std::string::npos) << r.second;
}

TEST_F(CliTest, TruncatedSafetensorsHeader) {
  const std::string path = ModelFilePath(tmp_ / "bad", 1);
  Spit(path, Slurp(path).substr(0, 5));
  auto r = ImportBad();
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find(path), std::string::npos) << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, LyingSafetensorsHeaderLength) {
  const std::string path = ModelFilePath(tmp_ / "bad", 3);
  std::string bytes = Slurp(path);
  bytes[0] = static_cast<char>(0xff);
  bytes[5] = 0x7f;  // a header length far beyond the file
  Spit(path, bytes);
  auto r = ImportBad();
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find(path), std::string::npos) << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, MissingRankFile) {
  fs::remove(ModelFilePath(tmp_ / "bad", 5));
  auto r = ImportBad();
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find(ModelFilePath(tmp_ / "bad", 5) + ": missing"), std::string::npos) << r.second;
  ExpectStoreUnchanged();
}

// Rewrites rank 2's model file with `edit` applied to its tensor list; data zero.
void RewriteModelFile(const std::string& path, const std::function<void(std::vector<TensorSpec>&)>& edit) {
  auto header = ReadSafetensorsHeader(Env::Default(), path);
  ASSERT_TRUE(header.ok());
  std::vector<TensorSpec> specs;
  for (const SafetensorsEntry& e : header->tensors) specs.push_back({e.name, e.dtype, e.shape});
  edit(specs);
  auto w = SafetensorsWriter::Create(Env::Default(), path, specs, {});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const TensorSpec& s : specs) {
    std::string zeros(NumElements(s.shape) * DTypeSize(s.dtype), '\0');
    ASSERT_TRUE((*w)->Append(zeros.data(), zeros.size()).ok());
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

TEST_F(CliTest, WrongShape) {
  const std::string path = ModelFilePath(tmp_ / "bad", 2);
  RewriteModelFile(path, [](std::vector<TensorSpec>& specs) {
    for (TensorSpec& s : specs) {
      if (s.name == "language_model.encoder.layers.0.self_attention.dense.weight") s.shape = {32, 32};
    }
  });
  auto r = ImportBad();
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find(path + ": tensor 'language_model.encoder.layers.0.self_attention.dense.weight' has shape "
                                 "[32, 32], expected [32, 16]"),
            std::string::npos)
      << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, UnknownTensor) {
  const std::string path = ModelFilePath(tmp_ / "bad", 2);
  RewriteModelFile(path, [](std::vector<TensorSpec>& specs) {
    specs.push_back({"rotary.inv_freq", DType::kF32, {8}});
  });
  auto r = ImportBad();
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find(path + ": unknown tensor 'rotary.inv_freq'"), std::string::npos) << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, ConfigThatDoesNotDivide) {
  auto r = ImportBad("tp=3,pp=2,dp=2");
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find("rule 'language_model.embedding.word_embeddings.weight'"), std::string::npos) << r.second;
  r = Ptcfs("export --config tp=2,pp=3 " + tmp_ / "store " + tmp_ / "never");
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find("pp=3 does not divide layers=4"), std::string::npos) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "never"));
  ExpectStoreUnchanged();
}

TEST_F(CliTest, ReplicasThatDisagree) {
  // dp rank 1 of stage 0, tp 0 is rank 2: change one of its bytes.
  const std::string path = ModelFilePath(tmp_ / "bad", 2);
  auto header = ReadSafetensorsHeader(Env::Default(), path);
  ASSERT_TRUE(header.ok());
  std::string bytes = Slurp(path);
  bytes[header->Find("language_model.encoder.layers.0.input_layernorm.bias")->offset] ^= 0x10;
  Spit(path, bytes);
  auto r = ImportBad();
  EXPECT_EQ(r.first, 2);
  EXPECT_NE(r.second.find("replicas disagree: tensor 'language_model.encoder.layers.0.input_layernorm.bias'"),
            std::string::npos)
      << r.second;
  ExpectStoreUnchanged();
}

TEST_F(CliTest, CorruptedShardIsNamedByVerifyAndExport) {
  auto m = nlohmann::json::parse(Slurp(tmp_ / "store/gen-000001/manifest.json"));
  const auto& shard = m["shards"][7];
  const std::string file = tmp_ / "store" + "/" + shard["file"].get<std::string>();
  std::string bytes = Slurp(file);
  bytes[shard["offset"].get<size_t>() + 1] ^= 0x40;
  Spit(file, bytes);
  before_ = Snapshot(tmp_ / "store");
  auto r = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find(shard["tensor"].get<std::string>()), std::string::npos) << r.second;
  EXPECT_NE(r.second.find("1 of"), std::string::npos) << r.second;
  r = Ptcfs("export --config tp=1,pp=1 " + tmp_ / "store " + tmp_ / "out");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find(shard["tensor"].get<std::string>()), std::string::npos) << r.second;
  EXPECT_FALSE(fs::exists(tmp_ / "out"));
  ExpectStoreUnchanged();
}

TEST_F(CliTest, BadStorePaths) {
  auto r = Ptcfs("inspect " + tmp_ / "nowhere");
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find(tmp_ / "nowhere"), std::string::npos) << r.second;
  Spit(tmp_ / "garbage.json", "{");
  fs::create_directories(tmp_ / "g");
  Spit(tmp_ / "g/manifest.json", "not json");
  r = Ptcfs("verify " + tmp_ / "g");
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find("manifest.json"), std::string::npos) << r.second;
}

// Issue 41, item 7: control bytes of an input (a path, a key in a file, an
// etcd member's address) reached the terminal raw and could move the cursor
// or forge a line. Every message prints them escaped, as Python's repr does.
TEST_F(CliTest, ControlBytesInInputsArePrintedEscaped) {
  const std::string dir = tmp_ / "a\x1b[2Jb\nptcfs: OK";
  fs::create_directories(dir);
  auto r = Ptcfs("import --format hf '" + dir + "' " + tmp_ / "x");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_EQ(r.second.find('\x1b'), std::string::npos) << r.second;
  EXPECT_NE(r.second.find("a\\x1b[2Jb\\nptcfs: OK"), std::string::npos) << r.second;
  EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << r.second;
  r = Ptcfs("inspect --bogus-\x07-option " + tmp_ / "x");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_EQ(r.second.find('\x07'), std::string::npos) << r.second;
}

// Issue 41, item 7: a reconfigure the mount refused for its state (EBUSY: a save
// or change under way) exited 2, the code of a usage error. Only a config the
// mount finds wrong (EINVAL) exits 2 now; any other refusal exits 1 and says
// why. The refusal here is the kernel's (a file size limit: EFBIG) on a
// directory laid out as a mount's control files, which a busy mount cannot be
// made to give on demand.
TEST_F(CliTest, ReconfigureRefusedForTheMountsStateExitsOne) {
  const std::string fake = tmp_ / "fake";
  fs::create_directories(fake + "/.ptcfs");
  Spit(fake + "/.ptcfs/status", R"({"state": "serving", "last_error": "a save is running"})");
  Spit(fake + "/.ptcfs/config", "");
  auto [code, out] = Sh("trap '' XFSZ; ulimit -f 0; " + std::string(PTCFS_BINARY) + " reconfigure " + fake +
                        " --to tp=1 2>&1");
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(Contains(out, "refused (File too large): a save is running")) << out;
}

}  // namespace
}  // namespace ptc
