// Hugging Face's own libraries, from PyPI, against ptcfs's hf/ view
// (docs/hf_format.md): transformers' from_pretrained through a real mount and
// save_pretrained's output imported, safetensors reading every shard. The
// client code is tests/clients/hf_clients.py, run in the venv of
// tools/setup-deps.sh (.venv/ at the repository root, or $PTCFS_VENV). Without
// the venv (or transformers in it) the suite skips (77), and fails under CI=true.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "mount_util.h"
#include "venv_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kLlamaDims = "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32";
const std::string kLlama = "--schema llama --dims " + kLlamaDims;
const std::string kGptDims = "layers=4,hidden=32,heads=4,vocab=96,seq=16";
const std::string kGpt = "--schema megatron-gpt --dims " + kGptDims;

std::string Client(const std::string& script = "hf_clients.py") {
  return ClientPython() + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/" + script + " ";
}

class HfClientsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    RequireFuse();
    RequireVenv("'torch', 'safetensors', 'transformers'");
  }
  void Run(const std::string& args) {
    auto [code, out] = Ptcfs(args);
    ASSERT_EQ(code, 0) << args << "\n" << out;
  }
  // hf_clients.py (or `script`) CMD ARGS; expects "<CMD> OK".
  void Python(const std::string& cmd, const std::string& args, const std::string& script = "hf_clients.py") {
    auto [code, out] = Sh(Client(script) + cmd + " " + args + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    std::string upper;
    for (char c : cmd) upper.push_back(static_cast<char>(std::toupper(c)));
    EXPECT_NE(out.find(upper + " OK"), std::string::npos) << out;
    std::printf("%s", out.substr(out.rfind(upper + " OK") == std::string::npos ? 0 : out.rfind(upper + " OK")).c_str());
  }
  TempDir tmp_;
};

TEST_F(HfClientsTest, LlamaFromPretrainedThroughTheMountAndUnchangedByAReconfigure) {
  // f64 parameters with Adam state (not carried) stored in tp=2,pp=2 pieces; the reference is
  // synth's whole global tensors (tp=1).
  Run("synth " + kLlama + " --dtype f64 --optimizer adam --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("synth " + kLlama + " --dtype f64 --config tp=1 " + tmp_ / "ref");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format hf --hf-shard-size 300KB");
  const std::string hf = m.dir() + "/hf";
  // safetensors reads every shard, the index names every tensor once, and from_pretrained's
  // logits equal those of the weights the client cuts from the global tensors itself.
  Python("check", hf + " " + tmp_ / "ref --arch llama --dims " + kLlamaDims);
  ASSERT_EQ(Sh("mkdir " + tmp_ / "before && cp " + hf + "/* " + tmp_ / "before/").first, 0);
  const size_t files = std::distance(std::filesystem::directory_iterator(tmp_ / "before"), {});
  EXPECT_GT(files, 3u);  // config.json, the index and several shards
  // A reconfigure (and its rewrite) serves the same files, and they are export's.
  Run("reconfigure " + m.dir() + " --to tp=1,pp=4");
  WaitServing(m.dir());
  Run("export --format hf --shard-size 300KB " + tmp_ / "store " + tmp_ / "exported");
  for (const auto& e : std::filesystem::directory_iterator(tmp_ / "before")) {
    const std::string name = e.path().filename().string();
    for (const std::string& other : {hf + "/" + name, tmp_ / ("exported/" + name)}) {
      auto [cmp, out] = Sh("cmp " + e.path().string() + " " + other + " 2>&1");
      EXPECT_EQ(cmp, 0) << name << ": " << out;
    }
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(hf), {}), static_cast<long>(files));
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
}

TEST_F(HfClientsTest, MegatronGptIsGptBigCode) {
  // Legacy Megatron-LM GPT (learned positions, biases, q/k/v per head, tied head).
  Run("synth " + kGpt + " --dtype f64 --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kGpt + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("synth " + kGpt + " --dtype f64 --config tp=1 " + tmp_ / "ref");
  Run("export --format hf " + tmp_ / "store " + tmp_ / "hf");
  Python("check", tmp_ / "hf " + tmp_ / "ref --arch gpt --dims " + kGptDims);
}

TEST_F(HfClientsTest, SavePretrainedImportsAndComesBackByteForByteFromTp2Pp2) {
  // bf16 models save_pretrained wrote in 100KB shards: Llama with GQA untied and tied, GPTBigCode.
  Python("save", tmp_ / "llama=llama " + tmp_ / "tied=llama-tied " + tmp_ / "gpt=gpt --dtype bf16 --shard-size 100KB");
  for (const char* m : {"llama", "tied", "gpt"})
    Run("import --format hf " + tmp_ / m + " " + tmp_ / ("store-" + std::string(m)));
  // Untied Llama: out as Megatron rank files in tp=2,pp=2, into a store of its own, back to hf.
  const std::string dims = "--schema llama --dims layers=4,hidden=64,heads=4,kv_heads=2,vocab=96,seq=32,ffn=96";
  Run("export --config tp=2,pp=2 " + tmp_ / "store-llama " + tmp_ / "ranks");
  Run("import " + dims + " --config tp=2,pp=2 " + tmp_ / "ranks " + tmp_ / "store-ranks");
  Run("export --format hf --shard-size 100KB " + tmp_ / "store-ranks " + tmp_ / "back-llama");
  // Tied Llama and GPTBigCode: the store moved to tp=2,pp=2 (and compacted: new pieces), back to hf.
  for (const char* m : {"tied", "gpt"}) {
    const std::string store = tmp_ / ("store-" + std::string(m));
    Run("transform " + store + " --to tp=2,pp=2");
    Run("compact " + store);
    Run("export --format hf --shard-size 100KB " + store + " " + tmp_ / ("back-" + std::string(m)));
  }
  Python("same", tmp_ / "llama " + tmp_ / "back-llama " + tmp_ / "tied " + tmp_ / "back-tied " + tmp_ / "gpt " +
                     tmp_ / "back-gpt");
}

// Mixtral: every layer MoE, 4 experts stored expert-parallel (ep=2, each expert's
// matrices split over etp=tp=2) with Adam state (not carried); the reference is
// synth's whole global tensors (tp=1).
TEST_F(HfClientsTest, MixtralFromPretrainedThroughTheMountOfAnExpertParallelStore) {
  const std::string dims = "layers=3,hidden=64,heads=4,kv_heads=2,vocab=96,seq=32,ffn=48,experts=4,moe_ffn=48";
  Run("synth --schema llama --dims " + dims + " --dtype f64 --optimizer adam --config tp=2,dp=2,ep=2 " +
      tmp_ / "saved");
  Run("import --schema llama --dims " + dims + " --config tp=2,dp=2,ep=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("synth --schema llama --dims " + dims + " --dtype f64 --config tp=1 " + tmp_ / "ref");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format hf --hf-shard-size 200KB");
  Python("check", m.dir() + "/hf " + tmp_ / "ref --arch mixtral --dims " + dims, "hf_moe_clients.py");
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
}

// Qwen3-MoE (layer 0 dense, q/k norms) and Mixtral as save_pretrained writes them:
// imported into ep=2 pieces, Qwen3-MoE's read through the mount's hf/ by
// from_pretrained against the store's own global tensors, both moved to
// ep=4 (compacted: new pieces) and exported back, byte for byte.
TEST_F(HfClientsTest, MoeSavePretrainedImportsAndComesBackByteForByteFromExpertParallel) {
  Python("save", tmp_ / "qwen=qwen3_moe " + tmp_ / "mix=mixtral --dtype f32 --shard-size 100KB", "hf_moe_clients.py");
  for (const char* m : {"qwen", "mix"})
    Run("import --format hf --config tp=2,dp=2,ep=2 " + tmp_ / m + " " + tmp_ / ("store-" + std::string(m)));
  Run("export --config tp=1 " + tmp_ / "store-qwen " + tmp_ / "ref-qwen");
  {
    Mount m(tmp_ / "store-qwen", tmp_ / "mnt", "--format hf --hf-shard-size 100KB");
    const std::string dims =
        "layers=4,hidden=64,heads=4,kv_heads=2,head_dim=16,vocab=96,seq=32,ffn=96,experts=4,moe_ffn=32,dense_first=1";
    Python("check", m.dir() + "/hf " + tmp_ / "ref-qwen --arch qwen3_moe --dims " + dims, "hf_moe_clients.py");
  }
  for (const char* m : {"qwen", "mix"}) {
    const std::string store = tmp_ / ("store-" + std::string(m));
    Run("transform " + store + " --to tp=1,dp=4,ep=4");
    Run("compact " + store);
    Run("export --format hf --shard-size 100KB " + store + " " + tmp_ / ("back-" + std::string(m)));
  }
  Python("same", tmp_ / "qwen " + tmp_ / "back-qwen " + tmp_ / "mix " + tmp_ / "back-mix");
}

// Qwen2-MoE (layer 0 dense, a shared expert and its sigmoid gate, no q/k/v biases) as
// save_pretrained writes it: imported into ep=2 pieces (the gate whole on every tp rank,
// the shared expert split over tp as a dense MLP), read through the mount's hf/ by
// from_pretrained against the store's own global tensors (the logits of the client's own
// cut exactly, the Megatron-Core forward with SharedExpertMLP's gate within 1e-4), moved
// to ep=4, compacted and exported back, byte for byte.
TEST_F(HfClientsTest, Qwen2MoeSharedExpertFromPretrainedAndBackByteForByte) {
  Python("save", tmp_ / "qwen2=qwen2_moe --dtype f32 --shard-size 100KB", "hf_moe_clients.py");
  const std::string store = tmp_ / "store";
  Run("import --format hf --config tp=2,dp=2,ep=2 " + tmp_ / "qwen2 " + store);
  Run("export --config tp=1 " + store + " " + tmp_ / "ref");
  {
    Mount m(store, tmp_ / "mnt", "--format hf --hf-shard-size 100KB");
    const std::string dims =
        "layers=4,hidden=64,heads=4,kv_heads=2,head_dim=16,vocab=96,seq=32,ffn=96,experts=4,moe_ffn=32,"
        "shared_ffn=40,dense_first=1";
    Python("check", m.dir() + "/hf " + tmp_ / "ref --arch qwen2_moe --dims " + dims, "hf_moe_clients.py");
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
  }
  Run("transform " + store + " --to tp=1,dp=4,ep=4");
  Run("compact " + store);
  Run("export --format hf --shard-size 100KB " + store + " " + tmp_ / "back");
  Python("same", tmp_ / "qwen2 " + tmp_ / "back");
}

}  // namespace
}  // namespace ptc
