// Megatron-LM torch checkpoints with real torch (Debian's python3-torch):
// files written by torch.save in Megatron's layout are imported, re-split to
// other configs, rendered (export and mount) and torch.load-ed back, every
// tensor equal to a reference reshard done in torch (tests/clients/
// megatron_ckpt.py); each rank keeps its own rng state; saves through the
// mount commit the model, the optimizer and the data position together, and
// a partial save names its missing rank; bad inputs are named and change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "mount_util.h"
#include "ptc/checkpoint/megatron/import.h"
#include "ptc/store/store.h"
#include "view/save_parts.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kModel = "--schema megatron-gpt --dims layers=4,hidden=32,heads=4,vocab=128,seq=16";

std::string Client() {
  return "/usr/bin/python3 " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/megatron_ckpt.py ";
}

class MegatronTorchTest : public ::testing::Test {
 protected:
  // A Megatron checkpoint written by torch.save.
  std::string Make(const std::string& name, const std::string& options) {
    const std::string dir = tmp_ / name;
    auto [code, out] = Sh(Client() + "make " + dir + " " + options);
    EXPECT_EQ(code, 0) << out;
    return dir;
  }
  void Import(const std::string& src, const std::string& store) {
    auto [code, out] = Ptcfs("import --format megatron " + kModel + " " + src + " " + store);
    ASSERT_EQ(code, 0) << out;
  }
  // The reference reshard of SRC (tp, pp) compared with the tree OUT (tp2, pp2).
  void Check(const std::string& src, const std::string& from, const std::string& out, const std::string& to,
             const std::string& extra = "") {
    auto [code, text] = Sh(Client() + "check " + src + " " + from + " " + out + " " + to + " " + extra);
    EXPECT_EQ(code, 0) << text;
    EXPECT_NE(text.find("CHECK OK"), std::string::npos) << text;
  }
  TempDir tmp_;
};

TEST_F(MegatronTorchTest, ImportReshardExportAndLoad) {
  const std::string src = Make("src", "--tp 2 --pp 2 --args --optimizer --iteration 300");
  Import(src, tmp_ / "store");
  for (const auto& [config, tp_pp] : std::vector<std::pair<std::string, std::string>>{
           {"tp=4,pp=1", "4 1"}, {"tp=1,pp=4", "1 4"}, {"tp=2,pp=2", "2 2"}}) {
    SCOPED_TRACE(config);
    const std::string out = tmp_ / ("out-" + config);
    auto [code, text] = Ptcfs("export --format megatron --config " + config + " " + tmp_ / "store " + out);
    ASSERT_EQ(code, 0) << text;
    Check(src, "2 2", out, tp_pp);
    EXPECT_EQ(testing::Slurp(out + "/latest_checkpointed_iteration.txt"), "300");
  }
  auto [zc, zout] =
      Sh("/usr/bin/python3 -m zipfile -t " + tmp_ / "out-tp=1,pp=4/iter_0000300/mp_rank_00_002/model_optim_rng.pt");
  EXPECT_EQ(zc, 0) << zout;
  // Through the store's other formats and back: the same bytes as the first export.
  auto [c1, o1] = Ptcfs("transform " + tmp_ / "store --to tp=4,pp=1");
  ASSERT_EQ(c1, 0) << o1;
  auto [c2, o2] = Ptcfs("export --format megatron --config tp=2,pp=2 " + tmp_ / "store " + tmp_ / "again");
  ASSERT_EQ(c2, 0) << o2;
  auto [c3, o3] = Sh("diff -r " + tmp_ / "again " + tmp_ / "out-tp=2,pp=2");
  EXPECT_EQ(c3, 0) << o3;
}

// Debian's torch 1.13 weights_only unpickler has no float opcode: it reads
// files without optimizer state (whose group settings are floats, as in
// Megatron's own files); torch 2's reads them all (clients_test).
TEST_F(MegatronTorchTest, WeightsOnlyLoadWithoutNamespace) {
  const std::string src = Make("src", "--tp 2 --pp 1 --dtype f16");
  Import(src, tmp_ / "store");
  auto [code, text] = Ptcfs("export --format megatron --config tp=1,pp=2 " + tmp_ / "store " + tmp_ / "out");
  ASSERT_EQ(code, 0) << text;
  Check(src, "2 1", tmp_ / "out", "1 2", "--weights-only");
}

// Megatron's optimizer layout (issue 16): two parameter groups split by
// weight decay, each with its settings, `step` in every state, fp32 masters
// per group. Imported, and rendered back in Megatron's order for other
// configs: the check compares every state, step and setting with the
// reference and loads each rank's state with torch.optim.Adam.load_state_dict.
TEST_F(MegatronTorchTest, MegatronsOptimizerLayoutRoundTripsAndLoadsIntoAdam) {
  const std::string src = Make("src", "--tp 2 --pp 1 --args --optimizer --dtype f16 --iteration 500");
  Import(src, tmp_ / "store");
  for (const auto& [config, tp_pp] : std::vector<std::pair<std::string, std::string>>{
           {"tp=1,pp=2", "1 2"}, {"tp=2,pp=1", "2 1"}, {"tp=4,pp=4", "4 4"}}) {
    SCOPED_TRACE(config);
    const std::string out = tmp_ / ("out-" + config);
    auto [code, text] = Ptcfs("export --format megatron --config " + config + " " + tmp_ / "store " + out);
    ASSERT_EQ(code, 0) << text;
    Check(src, "2 1", out, tp_pp);
  }
  // The tree ptcfs writes imports again, to the same files.
  Import(tmp_ / "out-tp=4,pp=4", tmp_ / "again");
  auto [code, text] = Ptcfs("export --format megatron --config tp=2,pp=1 " + tmp_ / "again " + tmp_ / "out-again");
  ASSERT_EQ(code, 0) << text;
  auto [dc, dout] = Sh("diff -r " + tmp_ / "out-again " + tmp_ / "out-tp=2,pp=1");
  EXPECT_EQ(dc, 0) << dout;
}

// Files in the one-group layout ptcfs rendered before (no step, no settings)
// still import; they render in Megatron's layout with Adam's default settings
// and step = the iteration.
TEST_F(MegatronTorchTest, OneGroupOptimizerFilesStillImport) {
  const std::string src = Make("src", "--tp 2 --pp 2 --optimizer --one-group");
  Import(src, tmp_ / "store");
  auto [code, text] = Ptcfs("export --format megatron --config tp=1,pp=2 " + tmp_ / "store " + tmp_ / "out");
  ASSERT_EQ(code, 0) << text;
  Check(src, "2 2", tmp_ / "out", "1 2");
}

// Legacy Megatron's parameter order (issue 26): tests/clients/legacy_gpt.py builds the
// modules of a legacy GPTModel rank in their registration order (ParallelTransformerLayer:
// input_layernorm, self_attention with query_key_value before dense, post_attention_layernorm,
// mlp), loads each rendered rank file into them, checks that the optimizer state is numbered
// in named_parameters() order (every fp32 master is its parameter), loads it into torch Adam
// over the module's groups and steps. The stepped modules' own save (Adam's numbering)
// imports, and renders back bit for bit.
TEST_F(MegatronTorchTest, LegacyModuleOrderNumbersTheOptimizerState) {
  const std::string dims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";
  const std::string legacy = "/usr/bin/python3 " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/legacy_gpt.py ";
  auto run = [&](const std::string& args) {
    auto [code, out] = Ptcfs(args);
    ASSERT_EQ(code, 0) << args << "\n" << out;
  };
  run("synth " + kModel + " --optimizer adam --config tp=2,pp=2 " + tmp_ / "synth");
  run("import " + kModel + " --config tp=2,pp=2 " + tmp_ / "synth " + tmp_ / "store");
  for (const auto& [config, tp_pp] :
       std::vector<std::pair<std::string, std::string>>{{"tp=1,pp=1", "1 1"}, {"tp=2,pp=2", "2 2"}}) {
    SCOPED_TRACE(config);
    const std::string out = tmp_ / ("out-" + config);
    run("export --format megatron --config " + config + " " + tmp_ / "store " + out);
    const std::string save = config == "tp=2,pp=2" ? " --save " + tmp_ / "saved" + " 7" : "";
    auto [code, text] = Sh(legacy + "run " + out + " " + tp_pp + " --dims " + dims + save + " 2>&1");
    EXPECT_EQ(code, 0) << text;
    EXPECT_NE(text.find("RUN OK"), std::string::npos) << text;
  }
  run("import --format megatron " + kModel + " " + tmp_ / "saved " + tmp_ / "again");
  run("export --format megatron --config tp=2,pp=2 " + tmp_ / "again " + tmp_ / "out-again");
  auto [code, text] = Sh(legacy + "same " + tmp_ / "saved " + tmp_ / "out-again 2 2 2>&1");
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("SAME OK"), std::string::npos) << text;
  // The same save in another order (dense before query_key_value in layer 1 of stage 0, the
  // numbering of such a model) is refused, naming the tensor.
  auto [rc, rout] =
      Sh("/usr/bin/python3 -c 'import sys, torch; p = sys.argv[1]; d = torch.load(p); "
         "e = d[\"model\"][\"language_model\"][\"encoder\"]; "
         "k = [\"layers.1.self_attention.dense.weight\", \"layers.1.self_attention.dense.bias\"]; "
         "moved = {n: e.pop(n) for n in k}; "
         "d[\"model\"][\"language_model\"][\"encoder\"] = dict(list(moved.items()) + list(e.items())); "
         "torch.save(d, p)' " +
         tmp_ / "saved/iter_0000007/mp_rank_00_000/model_optim_rng.pt");
  ASSERT_EQ(rc, 0) << rout;
  auto [ic, iout] = Ptcfs("import --format megatron " + kModel + " " + tmp_ / "saved " + tmp_ / "refused");
  EXPECT_NE(ic, 0);
  EXPECT_NE(iout.find("mp_rank_00_000/model_optim_rng.pt: model/language_model/encoder/"
                      "layers.1.self_attention.dense.weight: the rank's parameter 2 in the file's order"),
            std::string::npos)
      << iout;
}

// A parameter's shards (tensor-parallel pieces, replicated norms) share one
// step; a tree where they differ is refused, naming the state, and changes nothing.
// Legacy Megatron's nested model dict with Transformer Engine's extra state:
// refused naming the entry, not imported without it.
TEST_F(MegatronTorchTest, ExtraStateInALegacyNestedModelIsRefusedNamingIt) {
  const std::string src = Make("src", "--tp 2 --pp 1 --args --extra-state");
  auto [code, out] = Ptcfs("import --format megatron " + kModel + " " + src + " " + tmp_ / "store");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("mp_rank_00/model_optim_rng.pt: model/language_model/encoder/"
                     "layers.0.self_attention.query_key_value._extra_state: extra state in legacy Megatron's "
                     "nested model dict is not kept"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(tmp_ / "store/manifest.json")) << "nothing imported";
}

TEST_F(MegatronTorchTest, ShardsWithDifferentStepsAreRefused) {
  const std::string src = Make("src", "--tp 2 --pp 1 --optimizer");
  auto [dc, dout] =
      Sh("/usr/bin/python3 -c 'import sys, torch; p = sys.argv[1]; d = torch.load(p); "
         "d[\"optimizer\"][\"optimizer\"][\"state\"][0][\"step\"] += 1; torch.save(d, p)' " +
         src + "/iter_0000100/mp_rank_01/model_optim_rng.pt");
  ASSERT_EQ(dc, 0) << dout;
  auto [code, out] = Ptcfs("import --format megatron " + kModel + " " + src + " " + tmp_ / "store");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("mp_rank_01/model_optim_rng.pt: the optimizer step of "), std::string::npos) << out;
  EXPECT_NE(out.find(" differs from its step in another rank's file"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(tmp_ / "store/manifest.json")) << out;
}

// A save spread over workers, each holding some of its rank files (a
// cluster job's, docs/cluster.md), settles to the state one import of the
// whole tree keeps: rank 0's entries, every rank's rng state, every step. A
// rank file on no worker, or two workers whose files disagree, are named.
TEST_F(MegatronTorchTest, ASaveSplitOverWorkersSettlesAsOneImport) {
  const std::string src = Make("src", "--tp 2 --pp 2 --args --optimizer");
  const ModelSpec spec = Spec("megatron-gpt", "layers=4,hidden=32,heads=4,vocab=128,seq=16", DType::kF32, true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  auto whole = OpenMegatronCheckpoint(Env::Default(), {src, spec.schema, spec.dims, 100, std::nullopt});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // Worker 0 holds pipeline stage 0, worker 1 stage 1, worker 2 nothing.
  std::map<int, Part> parts;
  for (int w = 0; w < 3; ++w) {
    const std::string dir = tmp_ / ("w" + std::to_string(w));
    fs::create_directories(dir + "/iter_0000100");
    for (int tp = 0; tp < 2 && w < 2; ++tp) {
      const std::string rank = megatron::RankDirName(tp, w, 2);
      fs::copy(src + "/iter_0000100/" + rank, dir + "/iter_0000100/" + rank, fs::copy_options::recursive);
    }
    auto part = OpenMegatronSavePart(Env::Default(), {dir, spec.schema, spec.dims, 100, config});
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    EXPECT_EQ(part->kept.size(), w < 2 ? 2u : 0u);
    parts[w].extra = ptcfs::SavePartExtra(100, *part);
  }
  auto settled = ptcfs::SettleSave(100, spec, config, std::nullopt, parts);
  ASSERT_TRUE(settled.ok()) << settled.status().ToString();
  EXPECT_EQ(megatron::EncodeMegatronState(settled->state), whole->extra[std::string(megatron::kManifestKey)]);
  EXPECT_EQ(settled->layout.config().ToString(), config.ToString());
  EXPECT_EQ(settled->layout.spec().dtype, whole->spec.dtype);
  EXPECT_TRUE(settled->layout.spec().optimizer);
  // Stage 1's files on no worker.
  std::map<int, Part> without = parts;
  without.erase(1);
  auto missing = ptcfs::SettleSave(100, spec, config, std::nullopt, without);
  EXPECT_NE(
      missing.status().message().find("megatron/iter_0000100/mp_rank_00_001/model_optim_rng.pt: written on no worker"),
      std::string::npos)
      << missing.status().ToString();
  // Worker 1's files in another grid.
  std::map<int, Part> other = parts;
  other[1].extra["save"]["tp"] = 4u;
  auto disagree = ptcfs::SettleSave(100, spec, config, std::nullopt, other);
  EXPECT_NE(disagree.status().message().find("on worker 0 say tp=2, pp=2, BF16, with optimizer state, on worker 1 "
                                             "tp=4, pp=2"),
            std::string::npos)
      << disagree.status().ToString();
}

TEST_F(MegatronTorchTest, MountRendersEveryConfig) {
  testing::RequireFuse();
  const std::string src = Make("src", "--tp 2 --pp 2 --args --optimizer");
  Import(src, tmp_ / "store");
  testing::Mount m(tmp_ / "store", tmp_ / "mnt", "--format all");
  Check(src, "2 2", m.dir() + "/megatron", "2 2");
  auto [code, text] = Ptcfs("reconfigure " + m.dir() + " --to tp=4,pp=1");
  ASSERT_EQ(code, 0) << text;
  Check(src, "2 2", m.dir() + "/megatron", "4 1");
  auto [zc, zout] =
      Sh("/usr/bin/python3 -m zipfile -t " + m.dir() + "/megatron/iter_0000100/mp_rank_03/model_optim_rng.pt");
  EXPECT_EQ(zc, 0) << zout;
  // The mounted files are the bytes export writes.
  auto [ec, eout] = Ptcfs("export --format megatron --config tp=4,pp=1 " + tmp_ / "store " + tmp_ / "exp");
  ASSERT_EQ(ec, 0) << eout;
  auto [dc, dout] = Sh("diff -r " + m.dir() + "/megatron " + tmp_ / "exp");
  EXPECT_EQ(dc, 0) << dout;
}

TEST_F(MegatronTorchTest, SaveThroughTheMountThenReadAnotherConfig) {
  testing::RequireFuse();
  const std::string src = Make("src", "--tp 2 --pp 2 --args --optimizer");
  Import(src, tmp_ / "store");
  testing::Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron");
  const std::string megatron = m.dir() + "/megatron";
  // A save with a rank missing is refused: close() fails, nothing is committed.
  auto [fc, fout] = Sh(Client() + "save " + megatron + " " + tmp_ / "partial --iteration 150 --skip mp_rank_01_001");
  EXPECT_EQ(fc, 4) << fout;
  EXPECT_NE(fout.find("SAVE FAILED"), std::string::npos) << fout;
  auto status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 1) << status.dump();
  EXPECT_NE(status["last_error"].get<std::string>().find("iter_0000150/mp_rank_01_001: missing"), std::string::npos)
      << status.dump();
  EXPECT_EQ(testing::Slurp(megatron + "/latest_checkpointed_iteration.txt"), "100");
  // A whole save commits as a new generation and is read back in another config.
  auto [sc, sout] = Sh(Client() + "save " + megatron + " " + tmp_ / "saved --iteration 200");
  ASSERT_EQ(sc, 0) << sout;
  status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 2) << status.dump();
  EXPECT_EQ(testing::Slurp(megatron + "/latest_checkpointed_iteration.txt"), "200");
  {  // its pieces recorded their block CRC-32s: a rank file's zip CRCs are composed, not read
    auto store = Store::Open(Env::Default(), tmp_ / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (const ShardRecord& s : (*store)->current().shards) EXPECT_EQ(s.block_crc32s.size(), BlockCount(s)) << s.file;
  }
  Check(tmp_ / "saved", "2 2", megatron, "2 2");
  auto [rc, rout] = Ptcfs("reconfigure " + m.dir() + " --to tp=1,pp=4");
  ASSERT_EQ(rc, 0) << rout;
  Check(tmp_ / "saved", "2 2", megatron, "1 4");
  // The committed save left the staging area; the refused one stays there (and in megatron/).
  std::vector<std::string> staged;
  for (const auto& e : fs::directory_iterator(tmp_ / "store/ingest")) staged.push_back(e.path().filename());
  EXPECT_EQ(staged, std::vector<std::string>{"iter_0000150"});
  EXPECT_TRUE(fs::exists(megatron + "/iter_0000150/mp_rank_00_000/model_optim_rng.pt"));
}

TEST_F(MegatronTorchTest, PartialSaveNamesTheMissingRankAndACommitClearsTheError) {
  testing::RequireFuse();
  // tp=1, pp=2: with only mp_rank_00_000 written, the directories alone would
  // make a pp=1 save; the args say pp=2, so the missing stage is named.
  const std::string src = Make("src", "--tp 1 --pp 2 --args --optimizer");
  Import(src, tmp_ / "store");
  testing::Mount m(tmp_ / "store", tmp_ / "mnt", "--format megatron");
  const std::string megatron = m.dir() + "/megatron";
  auto [fc, fout] = Sh(Client() + "save " + megatron + " " + tmp_ / "partial --iteration 150 --skip mp_rank_00_001");
  EXPECT_EQ(fc, 4) << fout;
  auto status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 1) << status.dump();
  ASSERT_TRUE(status["last_error"].is_string()) << status.dump();
  EXPECT_NE(status["last_error"].get<std::string>().find("iter_0000150/mp_rank_00_001: missing (the args of"),
            std::string::npos)
      << status.dump();
  // The save done again, whole (the staged files rewritten), commits, and the error is gone with it.
  auto [sc, sout] = Sh(Client() + "save " + megatron + " " + tmp_ / "saved --iteration 150");
  ASSERT_EQ(sc, 0) << sout;
  status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 2) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  Check(tmp_ / "saved", "1 2", megatron, "1 2");
  EXPECT_FALSE(fs::exists(tmp_ / "store/ingest/iter_0000150"));
}

TEST_F(MegatronTorchTest, SaveMovesTheDataPositionWithTheModel) {
  testing::RequireFuse();
  const std::string src = Make("src", "--tp 2 --pp 2 --args --optimizer");
  Import(src, tmp_ / "store");
  for (const std::string& cmd : {"data synth --samples 1001 --min-len 1 --max-len 50 --vocab 300 " + tmp_ / "ds",
                                 "data import " + tmp_ / "ds " + tmp_ / "store --global-batch 37 --seed 5"}) {
    auto [code, out] = Ptcfs(cmd);
    ASSERT_EQ(code, 0) << cmd << "\n" << out;
  }
  testing::Mount m(tmp_ / "store", tmp_ / "mnt", "--format all");
  const std::string megatron = m.dir() + "/megatron";
  auto lines = [&] {
    const std::string ids = testing::Slurp(m.dir() + "/data/rank-00000/ids.txt");
    return std::count(ids.begin(), ids.end(), '\n');
  };
  EXPECT_EQ(lines(), 1001);
  auto generation = testing::MountStatus(m.dir())["generation"].get<int>();
  // consumed_train_samples = 3 global batches: the same generation holds the
  // saved model and step 3, and data/ reads from there.
  auto [sc, sout] = Sh(Client() + "save " + megatron + " " + tmp_ / "saved --iteration 200 --consumed 111");
  ASSERT_EQ(sc, 0) << sout;
  auto status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_EQ(status["dataset"]["consumed"], 111) << status.dump();
  EXPECT_EQ(status["dataset"]["step"], 3) << status.dump();
  EXPECT_EQ(lines(), 1001 - 111);
  auto [vc, vout] = Ptcfs("data view --config tp=2,pp=2 --rank 0 --file ids.txt " + tmp_ / "store");
  ASSERT_EQ(vc, 0) << vout;
  EXPECT_EQ(vout, testing::Slurp(m.dir() + "/data/rank-00000/ids.txt"));
  Check(tmp_ / "saved", "2 2", megatron, "2 2");
  // A position the dataset does not have is refused, naming it; nothing is committed.
  for (const auto& [consumed, needle] : std::vector<std::pair<int, std::string>>{
           {100, "args.consumed_train_samples 100 is not a position of the dataset: a multiple of its global batch 37"},
           {1001,
            "args.consumed_train_samples 1001 is not a position of the dataset: a multiple of its global batch"}}) {
    SCOPED_TRACE(consumed);
    const std::string it = std::to_string(300 + consumed);
    auto [bc, bout] = Sh(Client() + "save " + megatron + " " + tmp_ / ("bad" + it) + " --iteration " + it +
                         " --consumed " + std::to_string(consumed));
    EXPECT_EQ(bc, 4) << bout;
    status = testing::MountStatus(m.dir());
    EXPECT_EQ(status["generation"], generation + 1) << status.dump();
    EXPECT_EQ(status["dataset"]["consumed"], 111) << status.dump();
    ASSERT_TRUE(status["last_error"].is_string()) << status.dump();
    EXPECT_NE(status["last_error"].get<std::string>().find(needle), std::string::npos) << status.dump();
    EXPECT_EQ(testing::Slurp(megatron + "/latest_checkpointed_iteration.txt"), "200");
  }
  // Megatron's count is cumulative: 28 steps make epoch 0 (1001 samples, the
  // last batch short), so 31 global batches are step 3 of epoch 1.
  auto [ec, eout] = Sh(Client() + "save " + megatron + " " + tmp_ / "epoch1 --iteration 300 --consumed 1147");
  ASSERT_EQ(ec, 0) << eout;
  status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 2) << status.dump();
  EXPECT_EQ(status["dataset"]["epoch"], 1) << status.dump();
  EXPECT_EQ(status["dataset"]["step"], 3) << status.dump();
  EXPECT_EQ(status["dataset"]["consumed"], 111) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  EXPECT_EQ(lines(), 1001 - 111);
  auto [wc, wout] = Ptcfs("data view --config tp=2,pp=2 --rank 0 --file ids.txt " + tmp_ / "store");
  ASSERT_EQ(wc, 0) << wout;
  EXPECT_EQ(wout, testing::Slurp(m.dir() + "/data/rank-00000/ids.txt"));
  EXPECT_NE(wout, vout);  // epoch 1's order is another permutation
  generation = status["generation"].get<int>() - 1;
  // So is a state dict of another iteration than the latest file names.
  auto [ic, iout] = Sh(Client() + "save " + megatron + " " + tmp_ / "bad500 --iteration 500 --state-iteration 499");
  EXPECT_EQ(ic, 4) << iout;
  status = testing::MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  ASSERT_TRUE(status["last_error"].is_string()) << status.dump();
  EXPECT_NE(
      status["last_error"].get<std::string>().find("says iteration 499, latest_checkpointed_iteration.txt names 500"),
      std::string::npos)
      << status.dump();
}

TEST_F(MegatronTorchTest, BadCheckpointsAreNamedAndChangeNothing) {
  const std::string good = Make("good", "--tp 2 --pp 2");
  Import(good, tmp_ / "store");
  const auto before = testing::Snapshot(tmp_ / "store");
  // Each case copies the good tree, runs `damage` with $F = its rank file
  // (tp 1, pp 1), and imports with `model`.
  auto bad = [&](const std::string& name, const std::string& damage, const std::string& needle,
                 const std::string& model = kModel) {
    SCOPED_TRACE(name);
    const std::string dir = tmp_ / name;
    Sh("cp -r " + good + " " + dir);
    auto [dc, dout] = Sh("F=" + dir + "/iter_0000100/mp_rank_01_001/model_optim_rng.pt; " + damage);
    ASSERT_EQ(dc, 0) << dout;
    auto [code, out] = Ptcfs("import --format megatron " + model + " " + dir + " " + tmp_ / "store");
    EXPECT_NE(code, 0);
    EXPECT_NE(out.find(needle), std::string::npos) << out;
    EXPECT_TRUE(testing::Snapshot(tmp_ / "store") == before) << "the store changed";
  };
  bad("truncated", "truncate -s 3000 $F", "truncated/iter_0000100/mp_rank_01_001/model_optim_rng.pt");
  bad("crc",
      "/usr/bin/python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, \"rb\").read()); "
      "b[len(b) // 2] ^= 0xff; open(p, \"wb\").write(b)' $F",
      "bad CRC-32 in member 'model_optim_rng/data/");
  bad("global",
      "/usr/bin/python3 -c 'import os, sys, torch; p = sys.argv[1]; d = torch.load(p); "
      "d[\"hook\"] = os.system; torch.save(d, p)' $F",
      "unknown global 'posix.system'");
  bad("missing", "rm -r $(dirname $F)", "missing/iter_0000100/mp_rank_01_001: missing");
  bad("shape", "true", "shape [64, 32], the schema and config say [64, 64]",
      "--schema megatron-gpt --dims layers=4,hidden=64,heads=4,vocab=128,seq=16");
  bad("latest", "echo -n latest > $(dirname $(dirname $(dirname $F)))/latest_checkpointed_iteration.txt",
      "'latest' is not an iteration number");
}

}  // namespace
}  // namespace ptc
