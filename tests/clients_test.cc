// The libraries people use, from PyPI, reading and saving through a real
// mount: safetensors.safe_open (numpy and torch frameworks), torch 2's
// torch.load (weights_only by default, and mmap=True) and torch.save,
// megatron-core's IndexedDataset, numpy.load(mmap_mode='r'). They run in the
// venv tools/setup-deps.sh makes (.venv/ at the repository root, or
// $PTCFS_VENV; tools/requirements-clients.txt); tests/clients/real_clients.py,
// tests/clients/megatron_ckpt.py, tests/clients/mcore_gpt.py and tests/clients/mcore_moe.py
// (megatron-core's GPTModel on CPU, dense and with MoE layers) and tests/clients/train_moe.py (an MoE
// training job) hold the client code. Without the venv
// the suite skips (77), and fails under CI=true.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "mount_util.h"
#include "ptc/base/env.h"
#include "ptc/format/safetensors.h"
#include "venv_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kLlama = "--schema llama --dims layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32";
const std::string kGpt = "--schema megatron-gpt --dims layers=4,hidden=32,heads=4,vocab=128,seq=16";

std::string Python() { return ClientPython(); }
std::string Script(const std::string& name) { return std::string(PTCFS_SOURCE_DIR) + "/tests/clients/" + name + " "; }

// real_clients.py CMD ARGS with the venv's python; expects "<CMD> OK".
void Client(const std::string& cmd, const std::string& args) {
  auto [code, out] = Sh(Python() + Script("real_clients.py") + cmd + " " + args);
  EXPECT_EQ(code, 0) << out;
  std::string upper;
  for (char c : cmd) upper.push_back(static_cast<char>(std::toupper(c)));
  EXPECT_NE(out.find(upper + " OK"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

class ClientsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    RequireFuse();
    RequireVenv("'torch', 'safetensors', 'numpy', 'megatron.core', 'torchtitan'");
  }
  void Run(const std::string& args) {
    auto [code, out] = Ptcfs(args);
    ASSERT_EQ(code, 0) << args << "\n" << out;
  }
  // What the optimizer tests save through torch_dist: seed 9's bf16 llama with Adam, stored at
  // tp=2, in the local spec's legacy files at tp=2 (legacy9-tp2, what the save reads) and at
  // tp=1,pp=2 (legacy9-pp2, what a later load is compared with).
  void MakeSeed9Exports() {
    Run("synth " + kLlama + " --dtype bf16 --optimizer adam --seed 9 --config tp=2 " + tmp_ / "src9");
    Run("import " + kLlama + " --config tp=2 " + tmp_ / "src9 " + tmp_ / "store9");
    Run("export --format megatron --names local --config tp=2 " + tmp_ / "store9 " + tmp_ / "legacy9-tp2");
    Run("export --format megatron --names local --config tp=1,pp=2 " + tmp_ / "store9 " + tmp_ / "legacy9-pp2");
  }
  TempDir tmp_;
};

TEST_F(ClientsTest, SafetensorsAndNumpyMapEveryRankFile) {
  // f16 parameters (numpy has no bf16), f32 Adam state.
  const std::string model = kLlama + " --dtype f16 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format all");
  Client("safetensors", m.dir() + "/model " + tmp_ / "saved");
  Client("npy", m.dir() + "/model " + tmp_ / "saved");
  // Another config: the reference is that config's synth checkpoint.
  Run("reconfigure " + m.dir() + " --to tp=1,pp=4");
  Run("synth " + model + " --config tp=1,pp=4 " + tmp_ / "ref");
  Client("safetensors", m.dir() + "/model " + tmp_ / "ref");
  Client("npy", m.dir() + "/model " + tmp_ / "ref");
}

TEST_F(ClientsTest, Torch2LoadsEveryMegatronFileAndSavesThroughTheMount) {
  // A Megatron tree written by torch 2 (args, per-rank rng, Adam in Megatron's two groups).
  // (numpy 2, which a weights_only load allows through megatron.core's safe globals; Debian's
  // numpy 1 pickles its arrays under numpy.core, which torch 2 then refuses.)
  auto [mc, mout] = Sh(Python() + Script("megatron_ckpt.py") + "make " + tmp_ / "src --tp 2 --pp 2 --args --optimizer");
  ASSERT_EQ(mc, 0) << mout;
  Run("import --format megatron " + kGpt + " " + tmp_ / "src " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron");
  const std::string megatron = m.dir() + "/megatron";
  auto check = [&](const std::string& src, const std::string& from, const std::string& to) {
    // torch 2's weights_only load (megatron.core's safe globals), every tensor, setting and
    // step against the reference reshard, and torch.optim.Adam.load_state_dict.
    auto [code, out] = Sh(Python() + Script("megatron_ckpt.py") + "check " + src + " " + from + " " + megatron + " " +
                          to + " --weights-only");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("CHECK OK"), std::string::npos) << out;
  };
  Client("torchload", megatron);
  check(tmp_ / "src", "2 2", "2 2");
  Run("reconfigure " + m.dir() + " --to tp=1,pp=4");
  Client("torchload", megatron);
  check(tmp_ / "src", "2 2", "1 4");
  // torch 2's torch.save of a trained state through the mount commits, and reads back bit for bit.
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [sc, sout] = Sh(Python() + Script("megatron_ckpt.py") + "save " + megatron + " " + tmp_ / "saved --iteration 200");
  ASSERT_EQ(sc, 0) << sout;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  check(tmp_ / "saved", "1 4", "1 4");
  Run("reconfigure " + m.dir() + " --to tp=2,pp=2");
  check(tmp_ / "saved", "1 4", "2 2");
  Client("torchload", megatron);
}

TEST_F(ClientsTest, MegatronCoreGptModelLoadsItsRankFilesAndStepsAdam) {
  // megatron-core's GPTModel (local spec, float64, gloo on CPU) against the built-in llama
  // schema rendered in the local spec's names and parameter order (--names local).
  const std::string mcore = Python() + Script("mcore_gpt.py");
  const std::string model = kLlama;
  Run("synth " + model + " --dtype f64 --optimizer adam --config tp=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=2 " + tmp_ / "src " + tmp_ / "store");
  for (const std::string c : {"tp=2", "tp=1", "tp=1,pp=2"}) {
    SCOPED_TRACE(c);
    const std::string tp = c.substr(3, 1), pp = c.size() > 4 ? "2" : "1";
    Run("export --format megatron --names local --config " + c + " " + tmp_ / "store " + tmp_ / ("tree" + c));
    ASSERT_EQ(Sh("mkdir -p " + tmp_ / ("out" + c)).first, 0);
    auto [code, out] = Sh(mcore + "run " + tmp_ / ("tree" + c) + " " + tp + " " + pp + " " + tmp_ / ("out" + c) + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("RUN OK"), std::string::npos) << out;
  }
  // Logits at tp=2 and at pp=2 equal tp=1's (float64, within 1e-12).
  for (const std::string c : {"tp=2", "tp=1,pp=2"}) {
    auto [code, out] = Sh(mcore + "compare " + tmp_ / ("out" + c) + "/logits.pt " + tmp_ / "outtp=1/logits.pt 2>&1");
    EXPECT_EQ(code, 0) << c << "\n" << out;
  }
  // The default te names are not the model's: its strict load refuses them.
  Run("export --format megatron --config tp=1 " + tmp_ / "store " + tmp_ / "tree-te");
  ASSERT_EQ(Sh("mkdir -p " + tmp_ / "out-te").first, 0);
  auto [tc, tout] = Sh(mcore + "run " + tmp_ / "tree-te 1 1 " + tmp_ / "out-te 2>&1");
  EXPECT_NE(tc, 0) << tout;
  EXPECT_NE(tout.find("linear_qkv.layer_norm_weight"), std::string::npos) << tout;
  // The model's own saves through the mount (torch.save of model.state_dict() in its
  // registration order, with Megatron-Core's _extra_state entries, linear_qkv's as io.BytesIO,
  // and Adam's state numbered by its named_parameters()) commit, and megatron/ then renders
  // what each rank saved, bit for bit, keys in order; at tp=2, then at tp=1, pp=2. Loaded
  // strict, the extra state of each linear_qkv is the saved rank's of its module (tp mod 2).
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --names local");
  const std::string megatron = m.dir() + "/megatron";
  int generation = MountStatus(m.dir())["generation"].get<int>();
  for (const std::string c : {"save2", "strict2", "save12", "strict12"}) ASSERT_EQ(Sh("mkdir -p " + tmp_ / c).first, 0);
  // `strict`: the store has every _extra_state entry (not the synthetic one).
  auto save = [&](const std::string& tp_pp, const std::string& out, const std::string& iteration, bool strict) {
    auto [code, text] = Sh(mcore + "run " + megatron + " " + tp_pp + " " + tmp_ / out + (strict ? " --strict 2" : "") +
                           " --save " + iteration + " 2>&1");
    ASSERT_EQ(code, 0) << text;
    const auto status = MountStatus(m.dir());
    EXPECT_EQ(status["generation"], ++generation) << status.dump();
    EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
    EXPECT_EQ(Slurp(megatron + "/latest_checkpointed_iteration.txt"), iteration);
    std::tie(code, text) = Sh(mcore + "same " + megatron + " " + tp_pp + " " + tmp_ / out + " 2>&1");
    EXPECT_EQ(code, 0) << text;
    EXPECT_NE(text.find("SAME OK"), std::string::npos) << text;
  };
  save("2 1", "save2", "2", false);
  auto [code, out] = Sh(mcore + "run " + megatron + " 2 1 " + tmp_ / "strict2 --strict 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("RUN OK"), std::string::npos) << out;
  Run("reconfigure " + m.dir() + " --to tp=1,pp=2");
  std::tie(code, out) = Sh(mcore + "run " + megatron + " 1 2 " + tmp_ / "strict12 --strict 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("RUN OK"), std::string::npos) << out;
  // Rendered from the same saved state, the two grids' logits agree.
  std::tie(code, out) = Sh(mcore + "compare " + tmp_ / "strict2/logits.pt " + tmp_ / "strict12/logits.pt 2>&1");
  EXPECT_EQ(code, 0) << out;
  generation = MountStatus(m.dir())["generation"].get<int>();  // the reconfigure committed one
  save("1 2", "save12", "3", true);
}

TEST_F(ClientsTest, MegatronCoreMoeModelLoadsItsRankFilesAtEachEpAndSavesAcrossAnEpChange) {
  // megatron-core's GPTModel with MoE layers (local spec, SequentialMLP, 4 experts, top-2,
  // a shared expert; float64, gloo on CPU) against the llama schema with experts, in the
  // local spec's names: at ep=2 each ep rank reads mp_rank_00_00R and its optimizer state
  // is ChainedOptimizer's [dense, expert-parallel]; at tp=2 and at pp=2 (ep=1) one optimizer.
  const std::string mcore = Python() + Script("mcore_moe.py");
  const std::string model =
      "--schema llama --dims layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32";
  Run("synth " + model + " --dtype f64 --optimizer adam --config tp=1,dp=2,ep=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  struct Layout {
    std::string config, tp, ep, pp;
  };
  const Layout layouts[] = {{"tp=1,dp=2,ep=2", "1", "2", "1"},
                            {"tp=2", "2", "1", "1"},
                            {"tp=1,pp=2", "1", "1", "2"},
                            {"tp=1", "1", "1", "1"}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.config);
    const std::string tree = tmp_ / ("tree-" + l.config), out = tmp_ / ("out-" + l.config);
    Run("export --format megatron --names local --config " + l.config + " " + tmp_ / "store " + tree);
    ASSERT_EQ(Sh("mkdir -p " + out).first, 0);
    auto [code, text] = Sh(mcore + "run " + tree + " " + l.tp + " " + l.ep + " " + l.pp + " " + out + " 2>&1");
    EXPECT_EQ(code, 0) << text;
    EXPECT_NE(text.find("RUN OK"), std::string::npos) << text;
  }
  EXPECT_TRUE(std::filesystem::exists(tmp_ / "tree-tp=1,dp=2,ep=2/iter_0000000/mp_rank_00_001/model_optim_rng.pt"));
  // The same logits in every layout (float64, within 1e-12: the experts' outputs are summed
  // in another order when tokens travel between ep ranks).
  for (const std::string c : {"tp=1,dp=2,ep=2", "tp=2", "tp=1,pp=2"}) {
    auto [code, text] = Sh(mcore + "compare " + tmp_ / ("out-" + c) + "/logits.pt " + tmp_ / "out-tp=1/logits.pt 2>&1");
    EXPECT_EQ(code, 0) << c << "\n" << text;
  }
  // The ep=2 tree imports (`import --format megatron`; it has no args, so --config gives its
  // grid) and renders again byte for byte, at ep=2 and at ep=1.
  Run("import --format megatron " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "tree-tp=1,dp=2,ep=2 " +
      tmp_ / "reimported");
  auto [guess, guessed] =
      Ptcfs("import --format megatron " + model + " " + tmp_ / "tree-tp=1,dp=2,ep=2 " + tmp_ / "guessed");
  EXPECT_NE(guess, 0);
  EXPECT_NE(guessed.find("mp_rank_00_000: its second number is the pp rank, or the ep rank"), std::string::npos)
      << guessed;
  for (const std::string c : {"tp=1,dp=2,ep=2", "tp=1"}) {
    Run("export --format megatron --names local --config " + c + " " + tmp_ / "reimported " + tmp_ / ("again-" + c));
    auto [code, text] = Sh("diff -r " + tmp_ / ("again-" + c) + " " + tmp_ / ("tree-" + c) + " 2>&1");
    EXPECT_EQ(code, 0) << c << ": " << text;
  }
  // A save the model makes at ep=2 (the expert-data-parallel rank 0 of each ep rank writes
  // mp_rank_00_00R) commits through the mount; at ep=1 the mount then serves it bit for bit
  // (every parameter, its Adam moments and master; local expert K of ep rank R as expert 2R+K),
  // and the model loads it there strict and steps.
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --names local");
  const std::string megatron = m.dir() + "/megatron";
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  ASSERT_EQ(Sh("mkdir -p " + tmp_ / "save-ep2 " + tmp_ / "load-ep1").first, 0);
  auto [code, text] = Sh(mcore + "run " + megatron + " 1 2 1 " + tmp_ / "save-ep2 --save 5 2>&1");
  ASSERT_EQ(code, 0) << text;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  Run("reconfigure " + m.dir() + " --to tp=1");
  WaitServing(m.dir());
  EXPECT_EQ(Slurp(megatron + "/latest_checkpointed_iteration.txt"), "5");
  std::tie(code, text) = Sh(mcore + "merged " + megatron + " 2 " + tmp_ / "save-ep2 2>&1");
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("MERGED OK"), std::string::npos) << text;
  std::tie(code, text) = Sh(mcore + "run " + megatron + " 1 1 1 " + tmp_ / "load-ep1 2>&1");
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("RUN OK"), std::string::npos) << text;
}

// The router's expert bias (Megatron-Core's TopKRouter.expert_bias with
// moe_router_enable_expert_bias, a persistent buffer) as llama-eb holds it: a rule marked
// "buffer" (docs/schema_format.md). A store of mcore_moe.py's model with it, Adam's state
// synth'd, rendered at ep=2 through the mount: the model loads its rank files strict (the
// bias in the model dict), and the ChainedOptimizer's state numbers exactly Megatron-Core's
// own parameter groups, key for key (no state of the bias), which torch Adam loads and steps.
TEST_F(ClientsTest, MegatronCoreRouterExpertBiasIsABufferWithoutOptimizerState) {
  auto [code, out] = Ptcfs("schema llama");
  ASSERT_EQ(code, 0) << out;
  nlohmann::json doc = nlohmann::json::parse(out), rules = nlohmann::json::array();
  for (const auto& rule : doc["tensors"]) {
    rules.push_back(rule);
    if (rule["name"] != "decoder.layers.{i}.mlp.router.weight") continue;
    rules.push_back({{"name", "decoder.layers.{i}.mlp.router.expert_bias"},
                     {"shape", {"experts"}},
                     {"pp", "layer"},
                     {"layers", "moe"},
                     {"buffer", true}});
  }
  doc["name"] = "llama-eb";
  doc["tensors"] = rules;
  Spit(tmp_ / "llama-eb.json", doc.dump());
  const std::string model = "--schema " + tmp_ / "llama-eb.json" +
                            " --dims layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32";
  Run("synth " + model + " --dtype f64 --optimizer adam --config tp=1,dp=2,ep=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --names local");
  ASSERT_EQ(Sh("mkdir -p " + tmp_ / "out").first, 0);
  std::tie(code, out) = Sh(Python() + Script("mcore_moe.py") + "run " + m.dir() + "/megatron 1 2 1 " + tmp_ / "out" +
                           " --expert-bias 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("RUN OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MegatronCoreDistCheckpointingLoadsAndSavesAnMoeTorchDistTreeAtEachEp) {
  // megatron-core's dist_checkpointing.load of megatron/ as torch_dist for the MoE model of
  // mcore_moe.py (the experts stacked over layers and global experts, SequentialMLP's keys),
  // stored at ep=2, loaded at ep=2, at ep=1 and at tp=2: every parameter equals the legacy
  // render of its grid, bit for bit; in the TE spec's key of the MoE layers' norm too.
  const std::string model =
      "--schema llama --dims layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32";
  Run("synth " + model + " --dtype f64 --config tp=1,dp=2,ep=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
  struct Grid {
    std::string config, args;
  };
  for (const Grid& g : {Grid{"tp=1,dp=2,ep=2", "1 2 1"}, Grid{"tp=1", "1 1 1"}, Grid{"tp=2", "2 1 1"}}) {
    SCOPED_TRACE(g.config);
    const std::string legacy = tmp_ / ("legacy-" + g.config);
    Run("export --format megatron --names local --config " + g.config + " " + tmp_ / "store " + legacy);
    auto [code, out] =
        Sh(Python() + Script("mcore_moe.py") + "dist-load " + m.dir() + "/megatron " + g.args + " " + legacy + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("DIST-LOAD OK"), std::string::npos) << out;
  }
  // Megatron-Core's dist_checkpointing.save of other weights (seed 9) at ep=2 (its fc1 chunks
  // cut in the gate and up halves) commits through the mount (DcpSaveWrite in Megatron-Core's
  // keys) as one generation, which its load at ep=1 reads back equal to those weights.
  Run("synth " + model + " --dtype f64 --seed 9 --config tp=1,dp=2,ep=2 " + tmp_ / "src9");
  Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "src9 " + tmp_ / "store9");
  for (const std::string c : {"tp=1,dp=2,ep=2", "tp=1"}) {
    Run("export --format megatron --names local --config " + c + " " + tmp_ / "store9 " + tmp_ / ("legacy9-" + c));
  }
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] = Sh(Python() + Script("mcore_moe.py") + "dist-save " + m.dir() + "/megatron 1 2 1 " +
                        tmp_ / "legacy9-tp=1,dp=2,ep=2 200 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  std::tie(code, out) =
      Sh(Python() + Script("mcore_moe.py") + "dist-load " + m.dir() + "/megatron 1 1 1 " + tmp_ / "legacy9-tp=1 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DIST-LOAD OK"), std::string::npos) << out;
  // The MoE layers' norm keyed as the TE spec keys it (decoder.layers.pre_mlp_layernorm.weight):
  // loaded from the mount, and a save in those keys (the first weights again) taken.
  std::tie(code, out) = Sh(Python() + Script("mcore_moe.py") + "dist-load " + m.dir() + "/megatron 1 1 1 " +
                           tmp_ / "legacy9-tp=1 --te-norm-keys 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DIST-LOAD OK"), std::string::npos) << out;
  std::tie(code, out) = Sh(Python() + Script("mcore_moe.py") + "dist-save " + m.dir() + "/megatron 1 2 1 " +
                           tmp_ / "legacy-tp=1,dp=2,ep=2 201 --te-norm-keys 2>&1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
  std::tie(code, out) =
      Sh(Python() + Script("mcore_moe.py") + "dist-load " + m.dir() + "/megatron 1 1 1 " + tmp_ / "legacy-tp=1 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DIST-LOAD OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MegatronCoreChainedOptimizerLoadsAndSavesAnMoeTorchDistTreeAcrossAnEpChange) {
  // Megatron-Core's own optimizer for the MoE model of mcore_moe.py in bf16 (at ep=2 a
  // ChainedOptimizer of the dense and the expert-parallel optimizer, its torch_dist keys
  // chained_0. / chained_1., common.pt's optimizer {0: ..., 1: ...}) through megatron/ as
  // torch_dist. Its save at ep=2 (the state of the seed-9 store's legacy tree, with a step and
  // group settings of its own, the experts' lr apart from the dense groups') commits through the
  // mount; Megatron-LM's load at ep=2 then reads back every parameter, Adam state, step, fp32
  // master and group setting (the experts' own included) equal to that state (the legacy tree
  // loaded by Megatron's legacy path, tweaked alike), also after one step of both; and after a
  // reconfiguration to ep=1 (one optimizer, no prefix) again.
  const std::string model =
      "--schema llama --dims layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32";
  const std::string mcore = Python() + Script("mcore_moe.py");
  for (const std::string seed : {"0", "9"}) {
    Run("synth " + model + " --dtype bf16 --optimizer adam --seed " + seed + " --config tp=1,dp=2,ep=2 " +
        tmp_ / ("src" + seed));
    Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / ("src" + seed) + " " + tmp_ / ("store" + seed));
  }
  for (const std::string c : {"tp=1,dp=2,ep=2", "tp=1"}) {
    Run("export --format megatron --names local --config " + c + " " + tmp_ / "store9 " + tmp_ / ("legacy9-" + c));
  }
  Mount m(tmp_ / "store0", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
  const std::string megatron = m.dir() + "/megatron ";
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] = Sh(mcore + "optim-save " + megatron + "1 2 1 " + tmp_ / "legacy9-tp=1,dp=2,ep=2 300 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  std::tie(code, out) = Sh(mcore + "optim-load " + megatron + "1 2 1 " + tmp_ / "legacy9-tp=1,dp=2,ep=2 tweaked 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("OPTIM-LOAD OK"), std::string::npos) << out;
  ASSERT_EQ(WriteConfig(m.dir(), "tp=1"), 0) << MountStatus(m.dir()).dump();
  WaitServing(m.dir());
  EXPECT_EQ(Slurp(m.dir() + "/megatron/latest_checkpointed_iteration.txt"), "300");
  std::tie(code, out) = Sh(mcore + "optim-load " + megatron + "1 1 1 " + tmp_ / "legacy9-tp=1 tweaked 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("OPTIM-LOAD OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MoeTrainingThroughTheMountResumesAcrossEpChangesBitwiseEqualToTheUninterruptedRun) {
  // A real training job with experts (train_moe.py: the llama schema with 4 SequentialMLP
  // experts, top-2 routing and a shared expert, bf16 with fp32 masters and Adam) on one mount:
  // 3 steps at ep=2 (dp=2: each ep rank reads mp_rank_00_00R and its ChainedOptimizer state),
  // saved through the mount; reconfigured through .ptcfs/config to ep=4 (dp=4, one expert a
  // rank), 3 steps from that save, saved; then ep=1 (one optimizer), 2 steps, saved. After each
  // save the mount's tree holds bit for bit the state of the same steps run uninterrupted from
  // the ep=1 export without the mount (every parameter, fp32 master, moment, Adam's step), its
  // iteration and data position; every step's loss, batch and per-expert token counts equal the
  // reference's, and the 8 steps consume the epoch's 60 samples once each. Each save holds every
  // ep rank's own rng_state (expert-parallel tracker seeded per ep rank): each rank file renders its
  // own, and after an ep change a rank restores ep rank (its ep rank mod the saved ep)'s.
  const std::string model = "--schema llama --dims layers=2,hidden=32,heads=4,kv_heads=2,vocab=128,seq=16,experts=4,"
                            "moe_ffn=32,shared_ffn=32";
  const std::string train = Python() + Script("train_moe.py");
  const std::string ref = tmp_ / "ref", log = tmp_ / "steps.jsonl", data = "--samples 60 --batch 8 ";
  Run("synth " + model + " --dtype bf16 --optimizer adam --config tp=1,dp=2,ep=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=1,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  Run("data synth --samples 60 --min-len 17 --max-len 40 --vocab 128 --seed 3 " + tmp_ / "ds");
  Run("data import " + tmp_ / "ds " + tmp_ / "store --global-batch 8 --seed 5");
  Run("export --format megatron --names local --config tp=1 " + tmp_ / "store " + tmp_ / "start");
  auto [code, out] = Sh(train + "reference " + tmp_ / "start " + tmp_ / "ds " + ref + " " + data +
                        "--seed 5 --steps 8 --saves 3,6,8 2>&1");
  ASSERT_EQ(code, 0) << out;
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --names local");
  struct Segment {
    std::string config;  // written to .ptcfs/config first ("": the mounted one)
    int steps, ep;
  };
  int t = 0, rng_from = 0;  // each save's rng_state per ep rank: a rank loads ep rank (its own mod rng_from)'s
  for (const Segment& s : {Segment{"", 3, 2}, Segment{"tp=1,dp=4,ep=4", 3, 4}, Segment{"tp=1,dp=2", 2, 1}}) {
    SCOPED_TRACE("from step " + std::to_string(t) + " at " + s.config);
    if (!s.config.empty()) {
      ASSERT_EQ(WriteConfig(m.dir(), s.config), 0) << MountStatus(m.dir()).dump();
      WaitServing(m.dir());
    }
    std::tie(code, out) =
        Sh(train + "job " + m.dir() + " " + data + "--steps " + std::to_string(s.steps) + " --log " + log +
           " --rng-from-ep " + std::to_string(rng_from) + " 2>&1");
    rng_from = s.ep;
    ASSERT_EQ(code, 0) << out;
    ASSERT_NE(out.find("JOB OK"), std::string::npos) << out;
    t += s.steps;
    const auto status = MountStatus(m.dir());
    EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
    EXPECT_EQ(status["dataset"]["epoch"], t / 8) << status.dump();
    EXPECT_EQ(status["dataset"]["step"], t % 8) << status.dump();
    EXPECT_EQ(Slurp(m.dir() + "/megatron/latest_checkpointed_iteration.txt"), std::to_string(t));
    std::tie(code, out) =
        Sh(train + "check " + m.dir() + "/megatron " + ref + " " + std::to_string(t) + " --batch 8 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("CHECK OK " + std::to_string(t) + " ep " + std::to_string(s.ep)), std::string::npos) << out;
  }
  std::tie(code, out) = Sh(train + "steps " + ref + " " + log + " --samples 60 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("STEPS OK 8"), std::string::npos) << out;
}

TEST_F(ClientsTest, DcpLoadsTheMountInOneTwoAndThreeProcesses) {
  // bf16 parameters and f32 Adam state stored in tp=2,pp=2 pieces; torch's DCP loads them
  // into plain tensors and into DTensor shards at world sizes that cut them differently.
  const std::string model = kLlama + " --dtype bf16 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("synth " + model + " --config tp=1 " + tmp_ / "ref");  // whole global tensors: the reference
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format dcp");
  const std::string dcp = Python() + Script("dcp_clients.py") + "load " + m.dir() + "/dcp " + tmp_ / "ref --procs ";
  auto load = [&](int procs) {
    auto [code, out] = Sh(dcp + std::to_string(procs) + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  };
  load(1);
  load(2);
  // A layout change serves the same checkpoint; the mount's files are those `export` writes.
  Run("reconfigure " + m.dir() + " --to tp=1,pp=4");
  load(3);
  WaitServing(m.dir());  // the reconfigure committed: the mount and export read one generation
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "exported");
  for (const auto& entry : std::filesystem::directory_iterator(tmp_ / "exported")) {
    const std::string name = entry.path().filename().string();
    auto [cmp, cmp_out] = Sh("cmp " + entry.path().string() + " " + m.dir() + "/dcp/" + name + " 2>&1");
    EXPECT_EQ(cmp, 0) << name << ": " << cmp_out;
  }
}

TEST_F(ClientsTest, DcpSaveOfTwoProcessesImportsBitForBitInAnotherLayout) {
  // torch's dcp.save from 2 gloo processes, each its dim-0 shard of every tensor (with Adam's
  // step and param_groups, which ptcfs passes over), imported; exported in tp=2,pp=2 it equals
  // synth of that config, file for file.
  const std::string model = kLlama + " --dtype bf16 --optimizer adam";
  Run("synth " + model + " --config tp=1 " + tmp_ / "ref");
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "want");
  auto [code, out] = Sh(Python() + Script("dcp_clients.py") + "save " + tmp_ / "saved " + tmp_ / "ref --procs 2 2>&1");
  ASSERT_EQ(code, 0) << out;
  ASSERT_NE(out.find("SAVE OK"), std::string::npos) << out;
  Run("import --format dcp " + kLlama + " " + tmp_ / "saved " + tmp_ / "store");
  Run("export --config tp=2,pp=2 " + tmp_ / "store " + tmp_ / "got");
  for (int rank = 0; rank < 4; ++rank) {
    for (const char* file : {"model.safetensors", "optim.safetensors"}) {
      const std::string rel = "/rank-0000" + std::to_string(rank) + "/" + file;
      auto [cmp, cmp_out] = Sh("cmp " + tmp_ / "got" + rel + " " + tmp_ / "want" + rel + " 2>&1");
      EXPECT_EQ(cmp, 0) << rel << ": " << cmp_out;
    }
  }
}

TEST_F(ClientsTest, DcpSaveOfTwoProcessesThroughTheMountCommits) {
  // torch's dcp.save from 2 gloo processes into the mount's dcp/ commits a generation on
  // its .metadata; the mount's rank files in another layout are synth of the saved values,
  // and dcp.load in 3 processes reads them back.
  const std::string model = kLlama + " --dtype bf16 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("synth " + model + " --seed 9 --config tp=1 " + tmp_ / "ref");
  Run("synth " + model + " --seed 9 --config tp=1,pp=4 " + tmp_ / "want");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format all");
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  const std::string dcp = Python() + Script("dcp_clients.py");
  auto [code, out] = Sh(dcp + "save " + m.dir() + "/dcp/step-100 " + tmp_ / "ref --procs 2 2>&1");
  ASSERT_EQ(code, 0) << out;
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  Run("reconfigure " + m.dir() + " --to tp=1,pp=4");
  for (int rank = 0; rank < 4; ++rank) {
    for (const char* file : {"model.safetensors", "optim.safetensors"}) {
      const std::string rel = "/rank-0000" + std::to_string(rank) + "/" + file;
      auto [cmp, cmp_out] = Sh("cmp " + m.dir() + "/model" + rel + " " + tmp_ / "want" + rel + " 2>&1");
      EXPECT_EQ(cmp, 0) << rel << ": " << cmp_out;
    }
  }
  std::tie(code, out) = Sh(dcp + "load " + m.dir() + "/dcp " + tmp_ / "ref --procs 3 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, TorchtitanLoadsAndSavesTheMountsDcpInItsNames) {
  // torchtitan's Llama3Model (torchtitan 0.3 from PyPI) and its checkpointer's flattening,
  // against dcp/ in torchtitan's names (--dcp-names torchtitan): f32 parameters and Adam's
  // moments stored in tp=2,pp=2 pieces. The reference is torchtitan's own
  // Llama3StateDictAdapter.from_hf (which permutes q and k for its RoPE) of ptcfs's HF export.
  const std::string model = kLlama + " --dtype f32 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "saved");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
  Run("export --format hf " + tmp_ / "store " + tmp_ / "hf");
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "torch-keys");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format dcp --dcp-names torchtitan");
  const std::string titan = Python() + Script("titan_clients.py");
  const std::string dcp = m.dir() + "/dcp ";
  for (const char* procs : {"1", "3"}) {
    auto [code, out] = Sh(titan + "load " + dcp + tmp_ / "hf " + tmp_ / "torch-keys --procs " + procs + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  }
  // Its save from 3 processes (each a dim-0 shard: the cuts fall inside heads; the optimizer's
  // flattened state dict from torch's get_optimizer_state_dict over AdamW, a step and every
  // group setting per parameter) commits, reads back bit for bit at 2, and resumes as
  // torchtitan resumes (set_optimizer_state_dict: the saved step, settings and moments);
  // the values of another seed do not read back.
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] = Sh(titan + "save " + m.dir() + "/dcp/step-7 5 " + tmp_ / "hf --procs 3 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  std::tie(code, out) = Sh(titan + "same " + dcp + "5 " + tmp_ / "hf --procs 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("SAME OK"), std::string::npos) << out;
  std::tie(code, out) = Sh(titan + "same " + dcp + "6 " + tmp_ / "hf --procs 1 2>&1");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("tensors differ"), std::string::npos) << out;
  // Issue 41, item 9: the job restarted resumes, as its checkpointer finds its latest step:
  // dcp/step-7 is the committed state, with the train_state, lr_scheduler and (per dp rank)
  // dataloader entries the save held; also after a layout change of the store.
  EXPECT_TRUE(std::filesystem::exists(m.dir() + "/dcp/step-7/.metadata"));
  std::tie(code, out) = Sh(titan + "resume " + dcp + "5 " + tmp_ / "hf --procs 3 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("RESUME OK"), std::string::npos) << out;
  Run("reconfigure " + m.dir() + " --to tp=1,pp=2");
  std::tie(code, out) = Sh(titan + "resume " + dcp + "5 " + tmp_ / "hf --procs 3 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("RESUME OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, TorchtitanQwen3MoeLoadsAndSavesTheMountsDcpExpertParallel) {
  // torchtitan's own Qwen3 MoE (every layer MoE, 4 experts, q/k norms): a save_pretrained
  // model imported into expert-parallel pieces (tp=2,dp=2,ep=2), read from dcp/ in
  // torchtitan's names (each layer's experts one [experts, ...] tensor per weight) in 1 and 3
  // processes, DTensors Shard(0): expert parallel, uneven at 3. The reference is torchtitan's
  // own Qwen3StateDictAdapter.from_hf of the HF files, and zero expert biases.
  auto [code, out] = Sh(Python() + Script("hf_moe_clients.py") + "save " + tmp_ / "hf=qwen3_moe_all 2>&1");
  ASSERT_EQ(code, 0) << out;
  Run("import --format hf --config tp=2,dp=2,ep=2 " + tmp_ / "hf " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format dcp --dcp-names torchtitan");
  const std::string titan = Python() + Script("titan_moe_clients.py");
  const std::string dcp = m.dir() + "/dcp ";
  for (const char* procs : {"1", "3"}) {
    std::tie(code, out) = Sh(titan + "load " + dcp + tmp_ / "hf --procs " + procs + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  }
  // Its save from 3 processes (w2/w3 chunks of experts 0-1 and 2-3, torch's cut of 4 over 3;
  // every expert's w1 rows cut at 11 and 22; Adam's moments, steps and group settings, random expert biases, torchtitan's
  // other entries) commits, reads back bit for bit at 3 and,
  // after the store moved to ep=4, at 2, resuming as torchtitan resumes; the MoE blocks'
  // outputs equal the saved weights'. Another seed's values do not read back.
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Sh(titan + "save " + m.dir() + "/dcp/step-3 5 " + tmp_ / "hf --procs 3 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  std::tie(code, out) = Sh(titan + "same " + dcp + "5 " + tmp_ / "hf --procs 3 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("SAME OK"), std::string::npos) << out;
  Run("reconfigure " + m.dir() + " --to tp=1,dp=4,ep=4");
  std::tie(code, out) = Sh(titan + "same " + dcp + "5 " + tmp_ / "hf --procs 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("SAME OK"), std::string::npos) << out;
  std::tie(code, out) = Sh(titan + "same " + dcp + "6 " + tmp_ / "hf --procs 1 2>&1");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("tensors differ"), std::string::npos) << out;
}

// DeepSeek-V3's multi-head latent attention (tests/clients/titan_mla_clients.py, float32):
// transformers' DeepseekV3ForCausalLM (q compressed, a dense first layer, 4 experts and a shared
// one, random router biases) save_pretrained, imported at tp=2,dp=2,ep=2 (the up projections cut
// by heads), exported back byte for byte; torchtitan's DeepSeekV3Model loads dcp/ in its names at
// 1 and 2 processes equal to its own adapter's from_hf of the HF files, and gives transformers'
// logits from hf/; its dcp.save from 2 processes commits and reads back bit for bit, hf/ then
// holding the saved values (the bias as e_score_correction_bias).
TEST_F(ClientsTest, DeepseekMlaTorchtitanAndTransformersShareTheMount) {
  const std::string client = Python() + Script("titan_mla_clients.py");
  auto [code, out] = Sh(client + "hf " + tmp_ / "hf 7 2>&1");
  ASSERT_EQ(code, 0) << out;
  Run("import --format hf --config tp=2,dp=2,ep=2 " + tmp_ / "hf " + tmp_ / "store");
  Run("export --format hf " + tmp_ / "store " + tmp_ / "back");
  {  // every tensor of save_pretrained's file, its dtype, shape and bytes (the order of the files' own)
    const std::string a = Slurp(tmp_ / "hf/model.safetensors"), b = Slurp(tmp_ / "back/model.safetensors");
    auto ha = ReadSafetensorsHeader(Env::Default(), tmp_ / "hf/model.safetensors");
    auto hb = ReadSafetensorsHeader(Env::Default(), tmp_ / "back/model.safetensors");
    ASSERT_TRUE(ha.ok() && hb.ok());
    ASSERT_EQ(ha->tensors.size(), hb->tensors.size());
    for (const SafetensorsEntry& e : ha->tensors) {
      const SafetensorsEntry* f = hb->Find(e.name);
      ASSERT_NE(f, nullptr) << e.name;
      EXPECT_TRUE(e.dtype == f->dtype && e.shape == f->shape && a.substr(e.offset, e.nbytes) == b.substr(f->offset, f->nbytes))
          << e.name;
    }
  }
  EXPECT_EQ(nlohmann::json::parse(Slurp(tmp_ / "back/config.json")),
            nlohmann::json::parse(Slurp(tmp_ / "hf/config.json")));
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format all --dcp-names torchtitan");
  std::tie(code, out) = Sh(client + "load " + m.dir() + "/dcp " + tmp_ / "hf " + m.dir() + "/hf --procs 1,2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Sh(client + "save " + m.dir() + "/dcp/step-3 5 " + tmp_ / "hf " + m.dir() + "/hf --procs 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("SAVE OK"), std::string::npos) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
}

// torchtitan's own MoE with shared experts (its Qwen3 MoE blocks given its FeedForward
// as MoE.shared_experts: layers.I.moe.shared_experts.w1/w2/w3; q/k norms), every layer
// MoE, 4 experts, the store synth's in tp=2,dp=2,ep=2 with Adam's state. The reference is
// the store's own tensors under torch's keys (export --format dcp), cut into torchtitan's
// by the client itself (tests/clients/titan_shared_clients.py).
TEST_F(ClientsTest, TorchtitanSharedExpertsLoadAndSaveTheMountsDcp) {
  auto [code, schema] = Ptcfs("schema llama");
  ASSERT_EQ(code, 0) << schema;
  nlohmann::json doc = nlohmann::json::parse(schema), rules = nlohmann::json::array();
  for (const auto& rule : doc["tensors"]) {  // Megatron-Core's q/k norms after linear_qkv
    rules.push_back(rule);
    if (rule["name"] != "decoder.layers.{i}.self_attention.linear_qkv.weight") continue;
    for (const char* n : {"q_layernorm", "k_layernorm"}) {
      rules.push_back({{"name", std::string("decoder.layers.{i}.self_attention.") + n + ".weight"},
                       {"shape", {"head_dim"}},
                       {"pp", "layer"}});
    }
  }
  doc["name"] = "llama-qk";
  doc["tensors"] = rules;
  Spit(tmp_ / "llama-qk.json", doc.dump());
  const std::string dims =
      "layers=2,hidden=32,heads=4,kv_heads=2,head_dim=8,vocab=64,seq=32,ffn=48,experts=4,moe_ffn=16,shared_ffn=24";
  const std::string model = "--schema " + tmp_ / "llama-qk.json --dims " + dims;
  Run("synth " + model + " --dtype f32 --optimizer adam --config tp=2,dp=2,ep=2 " + tmp_ / "src");
  Run("import " + model + " --config tp=2,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "torch");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format dcp --dcp-names torchtitan");
  const std::string titan = Python() + Script("titan_shared_clients.py");
  const std::string dcp = m.dir() + "/dcp ";
  for (const char* procs : {"1", "2"}) {
    std::tie(code, schema) = Sh(titan + "load " + dcp + dims + " " + tmp_ / "torch --procs " + procs + " 2>&1");
    EXPECT_EQ(code, 0) << schema;
    EXPECT_NE(schema.find("LOAD OK"), std::string::npos) << schema;
  }
  // Its save from 2 processes (the shared experts' rows cut 12/12, Adam's moments, steps,
  // groups) commits, and the store's tensors under torch's keys, cut by the client, are the
  // saved values bit for bit (another seed's are not). Reading back after a move of the
  // experts is TorchtitanQwen3MoeLoadsAndSavesTheMountsDcpExpertParallel's.
  std::string out;
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Sh(titan + "save " + m.dir() + "/dcp/step-3 5 " + dims + " --procs 2 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "torch5");
  std::tie(code, out) = Sh(titan + "torch " + tmp_ / "torch5 5 " + dims + " 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("TORCH OK"), std::string::npos) << out;
  std::tie(code, out) = Sh(titan + "torch " + tmp_ / "torch5 6 " + dims + " 2>&1");
  EXPECT_NE(code, 0) << out;
}

// A Mixtral-shaped store (no q/k norms, no shared experts) in torchtitan's names: its Qwen3
// MoE built without qk_norm (make_gqa_config's default) loads it and saves into it.
TEST_F(ClientsTest, TorchtitanMixtralShapedMoeLoadsAndSavesTheMountsDcp) {
  const std::string dims =
      "layers=2,hidden=32,heads=4,kv_heads=2,head_dim=8,vocab=64,seq=32,ffn=48,experts=4,moe_ffn=16";
  Run("synth --schema llama --dims " + dims + " --dtype f32 --optimizer adam --config tp=2,dp=2,ep=2 " + tmp_ / "src");
  Run("import --schema llama --dims " + dims + " --config tp=2,dp=2,ep=2 " + tmp_ / "src " + tmp_ / "store");
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "torch");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format dcp --dcp-names torchtitan");
  const std::string titan = Python() + Script("titan_shared_clients.py");
  auto [code, out] = Sh(titan + "load " + m.dir() + "/dcp " + dims + " " + tmp_ / "torch --no-qk-norm --procs 2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Sh(titan + "save " + m.dir() + "/dcp/step-3 5 " + dims + " --no-qk-norm --procs 2 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "torch5");
  std::tie(code, out) = Sh(titan + "torch " + tmp_ / "torch5 5 " + dims + " --no-qk-norm 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("TORCH OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MegatronCoreDistCheckpointingLoadsTheTorchDistTree) {
  // megatron-core's dist_checkpointing.load (GPTModel, local spec, float64, gloo on CPU) of
  // megatron/ as torch_dist, at two grids other than the stored one: every parameter equals
  // the legacy render of its grid (`export --format megatron`), bit for bit.
  const std::string model = kLlama + " --dtype f64 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "src");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "src " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
  for (const auto& [tp, pp] : {std::pair<int, int>{1, 2}, {2, 1}}) {
    const std::string grid = std::to_string(tp) + " " + std::to_string(pp);
    const std::string legacy = tmp_ / ("legacy" + std::to_string(tp) + std::to_string(pp));
    Run("export --format megatron --names local --config tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + " " +
        tmp_ / "store " + legacy);
    auto [code, out] =
        Sh(Python() + Script("mcore_dist.py") + "load " + m.dir() + "/megatron " + grid + " " + legacy + " 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
  }
}

TEST_F(ClientsTest, MegatronCoreDistCheckpointingSaveThroughTheMountCommits) {
  // megatron-core's dist_checkpointing.save (2 processes, tp=2) of other weights into
  // megatron/iter_0000200/, then the tracker: one generation at iteration 200, which its
  // dist_checkpointing.load at tp=1,pp=2 reads back equal to those weights' legacy render.
  Run("synth " + kLlama + " --dtype f64 --config tp=2,pp=2 " + tmp_ / "src");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "src " + tmp_ / "store");
  Run("synth " + kLlama + " --dtype f64 --seed 9 --config tp=2 " + tmp_ / "src9");
  Run("import " + kLlama + " --config tp=2 " + tmp_ / "src9 " + tmp_ / "store9");
  Run("export --format megatron --names local --config tp=2 " + tmp_ / "store9 " + tmp_ / "legacy9-tp2");
  Run("export --format megatron --names local --config tp=1,pp=2 " + tmp_ / "store9 " + tmp_ / "legacy9-pp2");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  const std::string mcore = Python() + Script("mcore_dist.py");
  auto [code, out] = Sh(mcore + "save " + m.dir() + "/megatron 2 1 " + tmp_ / "legacy9-tp2 200 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  EXPECT_EQ(Slurp(m.dir() + "/megatron/latest_checkpointed_iteration.txt"), "200");
  std::tie(code, out) = Sh(mcore + "load " + m.dir() + "/megatron 1 2 " + tmp_ / "legacy9-pp2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("LOAD OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MegatronCoreOptimizerLoadsAndSavesTheTorchDistTree) {
  // Megatron-Core's own optimizer (bf16 GPTModel, get_megatron_optimizer: fp32 masters over
  // torch AdamW) through torch_dist as Megatron-LM loads and saves it: loaded at tp=1,pp=2 from
  // a tp=2,pp=2 store, every parameter, Adam state, step, master and group setting equals the
  // same grid's legacy render loaded by Megatron's legacy path; then a tp=2 save of other
  // state (with a step and group settings of its own) through the mount commits, and a load
  // at tp=1,pp=2 reads that state back, step and settings included.
  const std::string model = kLlama + " --dtype bf16 --optimizer adam";
  Run("synth " + model + " --config tp=2,pp=2 " + tmp_ / "src");
  Run("import " + kLlama + " --config tp=2,pp=2 " + tmp_ / "src " + tmp_ / "store");
  Run("export --format megatron --names local --config tp=1,pp=2 " + tmp_ / "store " + tmp_ / "legacy-pp2");
  ASSERT_NO_FATAL_FAILURE(MakeSeed9Exports());
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
  const std::string mcore = Python() + Script("mcore_dist.py");
  const std::string tree = m.dir() + "/megatron ";
  auto [code, out] = Sh(mcore + "optim-load " + tree + "1 2 " + tmp_ / "legacy-pp2 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("OPTIM-LOAD OK"), std::string::npos) << out;
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Sh(mcore + "optim-save " + tree + "2 1 " + tmp_ / "legacy9-tp2 300 2>&1");
  ASSERT_EQ(code, 0) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  std::tie(code, out) = Sh(mcore + "optim-load " + tree + "1 2 " + tmp_ / "legacy9-pp2 tweaked 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("OPTIM-LOAD OK"), std::string::npos) << out;
  // The saved step and settings are what the load found, not the reference's own.
  std::tie(code, out) = Sh(mcore + "optim-load " + tree + "1 2 " + tmp_ / "legacy9-pp2 2>&1");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("step"), std::string::npos) << out;
}

// Megatron-Core's DistributedOptimizer (--use-distributed-optimizer, ZeRO-1) loads the
// dp_reshardable form a zero=1 store's torch_dist tree shows (docs/megatron_format.md, "The
// distributed optimizer in torch_dist") at tp=2,dp=2: each rank's masters and moments equal bit
// for bit the range of its buffer shard in the state the legacy path loads from a zero=0 export,
// steps and settings too; it steps and saves that form through the mount (every bucket cut where
// dp=2 cuts it), which commits; the mount reconfigured to tp=2,pp=2,dp=1, the optimizer loads it
// there, every range of every master and moment bit for bit what the saving ranks held.
TEST_F(ClientsTest, MegatronCoreDistributedOptimizerLoadsAndSavesTheDpReshardableTreeAcrossLayouts) {
  const std::string model = kLlama + " --dtype bf16 --optimizer adam";
  Run("synth " + model + " --config tp=1 " + tmp_ / "src");
  Run("import " + kLlama + " --config tp=1 " + tmp_ / "src " + tmp_ / "store");
  Run("export --format megatron --names local --config tp=2 " + tmp_ / "store " + tmp_ / "legacy-tp2");
  Run("transform --to tp=2,dp=2,zero=1 " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist --names local");
  const std::string mcore = Python() + Script("mcore_dist.py");
  const std::string tree = m.dir() + "/megatron ";
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] =
      Sh(mcore + "distopt-load " + tree + "2 1 2 " + tmp_ / "legacy-tp2 --save 300 " + tmp_ / "dump 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DISTOPT-LOAD OK"), std::string::npos) << out;
  EXPECT_NE(out.find("DISTOPT-SAVE OK"), std::string::npos) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  ASSERT_EQ(WriteConfig(m.dir(), "tp=2,pp=2,dp=1,zero=1"), 0);
  WaitServing(m.dir());
  std::tie(code, out) = Sh(mcore + "distopt-check " + tree + "2 2 1 " + tmp_ / "dump 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DISTOPT-CHECK OK"), std::string::npos) << out;
}

// The same with mcore_moe.py's MoE model: at tp=1,dp=4,ep=2 Megatron-Core's ChainedOptimizer (the
// dense DistributedOptimizer over dp=4, the experts' over edp=2) loads the tree, compared with the
// legacy path's ChainedOptimizer optimizer by optimizer, steps and saves it through the mount
// (chained_0. and chained_1. keys); the mount reconfigured to tp=1,dp=2 (ep = 1: the routed experts
// ordinary parameters of the one buffer, in SequentialMLP's order), the one DistributedOptimizer
// loads every expert's and every dense parameter's state the saving ranks held.
TEST_F(ClientsTest, MegatronCoreDistributedOptimizerSavesAnMoeDpReshardableTreeAtEpTwoAndLoadsItAtEpOne) {
  const std::string model =
      "--schema llama --dims layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32";
  Run("synth " + model + " --dtype bf16 --optimizer adam --config tp=1 " + tmp_ / "src");
  Run("import " + model + " --config tp=1 " + tmp_ / "src " + tmp_ / "store");
  Run("export --format megatron --names local --config tp=1,dp=2,ep=2 " + tmp_ / "store " + tmp_ / "legacy-ep2");
  Run("transform --to tp=1,dp=4,ep=2,zero=1 " + tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist --names local");
  const std::string mcore = Python() + Script("mcore_dist.py");
  const std::string tree = m.dir() + "/megatron ";
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] =
      Sh(mcore + "distopt-load-moe " + tree + "1 1 4 " + tmp_ / "legacy-ep2 --ep 2 --save 400 " + tmp_ / "dump 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DISTOPT-LOAD OK"), std::string::npos) << out;
  EXPECT_NE(out.find("DISTOPT-SAVE OK"), std::string::npos) << out;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  ASSERT_EQ(WriteConfig(m.dir(), "tp=1,dp=2,zero=1"), 0);
  WaitServing(m.dir());
  std::tie(code, out) = Sh(mcore + "distopt-check " + tree + "1 1 2 " + tmp_ / "dump --moe 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("DISTOPT-CHECK OK"), std::string::npos) << out;
}

// Issue 41, item 8: a torch_dist save with Adam state into a store that had
// none (one imported from Hugging Face, say) kept the saved step with no
// parameter attached, and megatron/ then showed step = the iteration. The
// save's step and settings are what a later load finds.
TEST_F(ClientsTest, MegatronCoreOptimizerSaveIntoAStoreWithoutOneKeepsItsStep) {
  const std::string model = kLlama + " --dtype bf16";
  Run("synth " + model + " --config tp=2 " + tmp_ / "src");
  Run("import " + kLlama + " --config tp=2 " + tmp_ / "src " + tmp_ / "store");
  ASSERT_NO_FATAL_FAILURE(MakeSeed9Exports());
  {
    Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron --ckpt-format torch_dist");
    const std::string mcore = Python() + Script("mcore_dist.py");
    const std::string tree = m.dir() + "/megatron ";
    auto [code, out] = Sh(mcore + "optim-save " + tree + "2 1 " + tmp_ / "legacy9-tp2 300 2>&1");
    ASSERT_EQ(code, 0) << out;
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
    std::tie(code, out) = Sh(mcore + "optim-load " + tree + "1 2 " + tmp_ / "legacy9-pp2 tweaked 2>&1");
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("OPTIM-LOAD OK"), std::string::npos) << out;
  }
  // The other trees show the saved step (mcore_dist.py's tweak: 1234) of every parameter, not
  // the iteration: dcp/'s, as its export converts to one torch.save file.
  Run("export --format dcp " + tmp_ / "store " + tmp_ / "dcp");
  Spit(tmp_ / "steps.py",
       "import sys, torch\n"
       "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
       "dcp_to_torch_save(sys.argv[1], sys.argv[2])\n"
       "steps = {p: s['step'] for p, s in torch.load(sys.argv[2], weights_only=False)['optim']['state'].items()}\n"
       "bad = {p: float(s) for p, s in steps.items() if float(s) != 1234.0}\n"
       "assert steps and not bad, bad\n"
       "print('STEPS OK', len(steps))\n");
  auto [code, out] = Sh(Python() + tmp_ / "steps.py " + tmp_ / "dcp " + tmp_ / "all.pt 2>&1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("STEPS OK"), std::string::npos) << out;
}

TEST_F(ClientsTest, MegatronCoreIndexedDatasetReadsEveryRank) {
  const std::string model = kGpt + " --config tp=1,pp=1,dp=4";
  Run("synth " + model + " " + tmp_ / "ck");
  Run("import " + model + " " + tmp_ / "ck " + tmp_ / "store");
  Run("data synth --samples 1001 --min-len 1 --max-len 50 --vocab 300 " + tmp_ / "ds");
  Run("data import " + tmp_ / "ds " + tmp_ / "store --global-batch 36 --seed 5");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--format all");
  Client("indexed", m.dir() + "/data " + tmp_ / "ds");
  Run("reconfigure " + m.dir() + " --to tp=1,pp=1,dp=3");
  Client("indexed", m.dir() + "/data " + tmp_ / "ds");
}

}  // namespace
}  // namespace ptc
