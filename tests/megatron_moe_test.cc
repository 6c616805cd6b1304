// Mixture of experts in Megatron's formats (docs/megatron_format.md, "Mixture of experts"):
// the routed experts' names in both of Megatron-Core's name sets and their registration
// orders (written out here from megatron-core 0.16.1's SequentialMLP and TEGroupedMLP),
// the rank directories with the expert-parallel rank (Megatron-LM's get_checkpoint_name),
// which ranks save (the expert-data-parallel rank 0 of each (tp, pp, ep)) and the configs
// its legacy save cannot hold, and the ChainedOptimizer's state (dense, then expert-parallel
// parameters, each numbered from 0) rendered and read back.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "test_util.h"
#include "view/export.h"

namespace ptc::megatron {
namespace {

using pickle::Value;
using ::ptc::testing::Contains;
using ::ptc::testing::LayoutView;

// 2 layers, both MoE, 4 experts of ffn 8, a shared expert of ffn 8.
constexpr const char* kMoeDims =
    "layers=2,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=4,moe_ffn=8,shared_ffn=8";

TEST(MegatronMoeNames, ExpertsRenameToTeGroupedMlpAndBack) {
  const std::string local = "decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight";
  EXPECT_EQ(NameIn(NameSet::kTe, local), "decoder.layers.3.mlp.experts.linear_fc1.weight12");
  EXPECT_EQ(NameIn(NameSet::kLocal, local), local);
  EXPECT_EQ(NameIn(NameSet::kTe, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight"),
            "decoder.layers.0.mlp.experts.linear_fc2.weight0");
  // The router, the shared experts and an MoE layer's own norm: one name in both sets.
  for (const char* same :
       {"decoder.layers.0.mlp.router.weight", "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
        "decoder.layers.0.pre_mlp_layernorm.weight",
        "decoder.layers.0.mlp.experts.local_experts.x.linear_fc1.weight"}) {
    EXPECT_EQ(NameIn(NameSet::kTe, same), same);
    EXPECT_EQ(NameIn(NameSet::kLocal, same), same);
  }
}

// One MoE layer as the schema lays it out (SequentialMLP's order: expert by expert), and
// as TEGroupedMLP registers it (linear_fc1's weight0..weightN-1, then linear_fc2's).
const std::vector<std::string> kSchemaLayer = {
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.pre_mlp_layernorm.weight",
    "decoder.layers.0.mlp.router.weight",
    "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
    "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight",
    "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
    "decoder.layers.0.mlp.shared_experts.linear_fc2.weight",
    "decoder.layers.1.self_attention.linear_proj.weight",
    "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight",
    "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight",
};
const std::vector<std::string> kTeLayer = {
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.pre_mlp_layernorm.weight",
    "decoder.layers.0.mlp.router.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight0",
    "decoder.layers.0.mlp.experts.linear_fc1.weight1",
    "decoder.layers.0.mlp.experts.linear_fc2.weight0",
    "decoder.layers.0.mlp.experts.linear_fc2.weight1",
    "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
    "decoder.layers.0.mlp.shared_experts.linear_fc2.weight",
    "decoder.layers.1.self_attention.linear_proj.weight",
    "decoder.layers.1.mlp.experts.linear_fc1.weight0",
    "decoder.layers.1.mlp.experts.linear_fc1.weight1",
    "decoder.layers.1.mlp.experts.linear_fc2.weight0",
    "decoder.layers.1.mlp.experts.linear_fc2.weight1",
};
// The local spec: input_layernorm first in the layer, the experts as the schema has them.
const std::vector<std::string> kLocalLayer = {
    "decoder.layers.0.input_layernorm.weight",
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.pre_mlp_layernorm.weight",
    "decoder.layers.0.mlp.router.weight",
    "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
    "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight",
    "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
    "decoder.layers.0.mlp.shared_experts.linear_fc2.weight",
    "decoder.layers.1.self_attention.linear_proj.weight",
    "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight",
    "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight",
};

std::vector<std::string> Ordered(NameSet names, const std::vector<std::string>& schema) {
  std::vector<std::string> out;
  for (size_t i : RegistrationOrder(names, schema)) out.push_back(NameIn(names, schema[i]));
  return out;
}

TEST(MegatronMoeNames, EachSetRegistersItsExpertsInItsOrder) {
  EXPECT_EQ(Ordered(NameSet::kTe, kSchemaLayer), kTeLayer);
  EXPECT_EQ(Ordered(NameSet::kLocal, kSchemaLayer), kLocalLayer);
  // Ten experts: weight10 after weight9 (numbers, not text).
  std::vector<std::string> ten, want;
  for (int k = 0; k < 10; ++k) {
    for (const char* m : {"linear_fc1", "linear_fc2"}) {
      ten.push_back("d.l.0.mlp.experts.local_experts." + std::to_string(k) + "." + m + ".weight");
    }
  }
  for (const char* m : {"linear_fc1", "linear_fc2"}) {
    for (int k = 0; k < 10; ++k) want.push_back(std::string("d.l.0.mlp.experts.") + m + ".weight" + std::to_string(k));
  }
  EXPECT_EQ(Ordered(NameSet::kTe, ten), want);
}

TEST(MegatronMoeNames, ViewsOfAnEpRankNameItsLocalExpertsAndRecogniseTheirSet) {
  const ModelSpec spec = testing::Spec("llama", kMoeDims);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  const RankView view = *LayoutView(spec, config, 1);  // ep rank 1: global experts 2 and 3
  const RankView te = ViewInNameSet(view, NameSet::kTe);
  std::map<std::string, std::string> global_of;  // te name -> global tensor
  for (const LocalTensor& t : te.model) global_of[t.name] = t.segments[0].tensor;
  EXPECT_EQ(global_of.at("decoder.layers.1.mlp.experts.linear_fc1.weight0"),
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight");
  EXPECT_EQ(global_of.at("decoder.layers.1.mlp.experts.linear_fc2.weight1"),
            "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight");
  for (const LocalTensor& t : view.model) {
    EXPECT_EQ(IsExpertParameter(t), t.name.find(".local_experts.") != std::string::npos) << t.name;
  }
  auto where = [](const std::string& name) { return "f.pt: model/" + name; };
  auto recognise = [&](const std::set<std::string>& file) {
    return RecogniseNameSet(
        view, [&](const std::string& n) { return file.count(n) > 0; }, where);
  };
  std::set<std::string> te_file, local_file, mixed;
  for (const LocalTensor& t : view.model) {
    te_file.insert(NameIn(NameSet::kTe, t.name));
    local_file.insert(NameIn(NameSet::kLocal, t.name));
    // Transformer Engine's norms with SequentialMLP's expert names (TE's spec without grouped GEMM).
    mixed.insert(IsExpertParameter(t) ? t.name : NameIn(NameSet::kTe, t.name));
  }
  EXPECT_EQ(*recognise(te_file), NameSet::kTe);
  EXPECT_EQ(*recognise(local_file), NameSet::kLocal);
  EXPECT_EQ(*recognise(mixed), NameSet::kTeSequential);  // megatron-core writes it: the schema's own names
  // The local spec's norms with TEGroupedMLP's experts: no spec of megatron-core names so.
  std::set<std::string> local_grouped;
  for (const LocalTensor& t : view.model) {
    local_grouped.insert(NameIn(IsExpertParameter(t) ? NameSet::kTe : NameSet::kLocal, t.name));
  }
  auto m = recognise(local_grouped);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(Contains(m.status().message(),
                       "f.pt: model/decoder.layers.0.mlp.experts.linear_fc1.weight0: in TEGroupedMLP's expert names, "
                       "but f.pt: model/decoder.layers.0.input_layernorm.weight is in the local spec's names (local): "
                       "no spec of megatron-core names so"))
      << m.status().message();
  // Experts in both: the second named with the first.
  std::set<std::string> two_experts = te_file;
  two_experts.erase("decoder.layers.1.mlp.experts.linear_fc2.weight1");
  two_experts.insert("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight");
  m = recognise(two_experts);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(Contains(m.status().message(),
                       "f.pt: model/decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight: in SequentialMLP's "
                       "expert names, but f.pt: model/decoder.layers.0.mlp.experts.linear_fc1.weight0 is in "
                       "TEGroupedMLP's expert names"))
      << m.status().message();
}

TEST(MegatronMoeTree, RankDirectoriesCarryTheEpRank) {
  EXPECT_EQ(RankDirName(1, 0, 1), "mp_rank_01");
  EXPECT_EQ(RankDirName(1, 0, 1, 0, 1), "mp_rank_01");
  EXPECT_EQ(RankDirName(1, 0, 1, 3, 4), "mp_rank_01_003");
  EXPECT_EQ(RankDirName(1, 2, 4, 3, 4), "mp_rank_01_002_003");
  const RankDir three = *ParseRankDirName("mp_rank_01_002_003");
  EXPECT_EQ(three.tp_rank, 1);
  EXPECT_EQ(three.pp_rank, 2);
  EXPECT_EQ(three.ep_rank, 3);
  EXPECT_EQ(*ResolveRankDir(three, true, true), (std::array<int, 3>{1, 2, 3}));
  EXPECT_FALSE(ResolveRankDir(three, true, false));
  // Two numbers: the pp rank, or the ep rank of a save with pp == 1 < ep.
  const RankDir two = *ParseRankDirName("mp_rank_01_003");
  EXPECT_EQ(*ResolveRankDir(two, true, false), (std::array<int, 3>{1, 3, 0}));
  EXPECT_EQ(*ResolveRankDir(two, false, true), (std::array<int, 3>{1, 0, 3}));
  EXPECT_FALSE(ResolveRankDir(two, false, false));
  for (const char* bad : {"mp_rank_01_002_003_004", "mp_rank_01_002_03", "mp_rank_01__003", "mp_rank_01_002_"}) {
    auto r = ParseRankDirName(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(Contains(r.status().message(), "mp_rank_TT_PPP_EEE")) << r.status().message();
  }
}

TEST(MegatronMoeTree, TheExpertDataParallelRankZeroOfEachFileSaves) {
  // tp=2, dp=2, ep=2 (etp = tp): ranks 0..3 of a stage are (tp, dp) = (0,0) (1,0) (0,1) (1,1);
  // the expert grid puts ep rank r at dp r, so every rank saves a file of its own.
  const ParallelConfig c = *ParseConfig("tp=2,dp=2,ep=2,pp=2");
  EXPECT_TRUE(CheckLegacySave(c).ok());
  EXPECT_EQ(*LegacySaveRank(c, 1, 0, 1), 3);
  EXPECT_EQ(*LegacySaveRank(c, 0, 1, 0), 4);
  // dp=4, ep=2: dp ranks 2 and 3 are expert-data-parallel rank 1 (they load, do not save).
  const ParallelConfig d = *ParseConfig("tp=1,dp=4,ep=2");
  EXPECT_EQ(*LegacySaveRank(d, 0, 0, 1), 1);
  EXPECT_FALSE(LegacySaveRank(d, 0, 0, 2));
  // etp=1 under tp=2 with ep=2: the two saving ranks hold (tp 0, ep 0) and (tp 1, ep 1): enough.
  EXPECT_TRUE(CheckLegacySave(*ParseConfig("tp=2,ep=2,etp=1")).ok());
  // etp=1 under tp=2 with ep=1: only rank 0 saves; tp rank 1's dense shard is nowhere.
  const Status s = CheckLegacySave(*ParseConfig("tp=2,dp=1,etp=1"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "no saving rank (expert-data-parallel rank 0) holds the dense shard of tp rank 1"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "etp=1 != tp=2")) << s.message();
  // etp=2 over tp=1, dp=2: the ranks of etp 0 and 1 both save mp_rank_00.
  const Status twice = CheckLegacySave(*ParseConfig("tp=1,dp=2,etp=2"));
  ASSERT_FALSE(twice.ok());
  EXPECT_TRUE(Contains(twice.message(), "two saving ranks write mp_rank_00")) << twice.message();
}

// The parameter each state number of optimizer `c` (0 dense, 1 experts) belongs to,
// by the local tensor in the storage of its exp_avg and fp32 master (which must agree).
std::vector<std::string> Numbered(const RankState& state, size_t c) {
  std::map<std::string, std::string> tensor_of;  // storage key -> local tensor name
  for (const auto& s : state.storages) {
    if (s.tensor != nullptr) tensor_of[s.key] = s.tensor->name;
  }
  const Value& optimizer = state.root.Find("optimizer")->items().at(c);
  const Value& groups = *optimizer.Find("optimizer")->Find("param_groups");
  std::map<int64_t, std::string> by_number;
  for (size_t g = 0; g < groups.items().size(); ++g) {
    EXPECT_EQ(groups.items()[g].Find("is_expert_parallel")->as_bool(), c == 1);
    const pickle::Items& params = groups.items()[g].Find("params")->items();
    for (size_t j = 0; j < params.size(); ++j) {
      const int64_t k = params[j].as_int();
      const std::string master =
          tensor_of.at(optimizer.Find("fp32_from_fp16_params")->items()[g].items()[j].tensor().storage_key);
      const std::string avg = tensor_of.at(
          optimizer.Find("optimizer")->Find("state")->Find(Value::Int(k))->Find("exp_avg")->tensor().storage_key);
      EXPECT_EQ(master.substr(0, master.rfind('.')), avg.substr(0, avg.rfind('.'))) << k;
      by_number[k] = avg.substr(0, avg.rfind('.'));
    }
  }
  std::vector<std::string> out;
  for (const auto& [k, name] : by_number) out.push_back(name);
  return out;
}

TEST(MegatronMoeOptimizer, ChainsTheDenseAndTheExpertParallelOptimizerAndReadsBack) {
  const ModelSpec spec = testing::Spec("llama", kMoeDims, DType::kBF16, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  for (NameSet names : {NameSet::kLocal, NameSet::kTe, NameSet::kTeSequential}) {
    for (int rank = 0; rank < config.world_size(); ++rank) {
      SCOPED_TRACE(std::string(NameSetName(names)) + " rank " + std::to_string(rank));
      const RankView view = *LayoutView(spec, config, rank);
      auto state = BuildRankState(spec, config, view, MegatronState{}, names);
      ASSERT_TRUE(state.ok()) << state.status().ToString();
      ASSERT_TRUE(state->root.Find("optimizer")->is_sequence());
      ASSERT_EQ(state->root.Find("optimizer")->items().size(), 2u);
      // Each optimizer numbers its parameters from 0: the dense ones with weight decay in the
      // model's order, then the 1-D ones; the experts' (all 2-D weights) in one group.
      std::vector<std::string> decay, none, experts;
      for (const LocalTensor& t : ViewInNameSet(view, names).model) {
        (IsExpertParameter(t) ? experts : t.shape.size() == 1 ? none : decay).push_back(t.name);
      }
      decay.insert(decay.end(), none.begin(), none.end());
      EXPECT_EQ(Numbered(*state, 0), decay);
      EXPECT_EQ(Numbered(*state, 1), experts);
      EXPECT_EQ(experts.size(), 2u * 2 * 2);  // 2 layers x 2 local experts x (fc1, fc2)
      EXPECT_EQ(state->root.Find("optimizer")->items()[1].Find("optimizer")->Find("param_groups")->items().size(), 1u);
      // Read back through a pickle round trip: every tensor of the schema's view.
      auto root = pickle::Unpickle(pickle::Pickle(state->root), "test");
      ASSERT_TRUE(root.ok());
      EXPECT_EQ(*FileNameSet(spec, view, *root, "f.pt"), names);
      auto found = FindRankTensors(spec, config, view, *root, "f.pt");
      ASSERT_TRUE(found.ok()) << found.status().ToString();
      std::map<std::string, const LocalTensor*> by_storage;
      for (const auto& s : state->storages) {
        if (s.tensor != nullptr) by_storage[s.key] = s.tensor;
      }
      size_t i = 0;
      for (const auto* list : {&view.model, &view.optim}) {
        for (const LocalTensor& t : *list) {
          const LocalTensor* stored = by_storage.at((*found)[i++].storage_key);
          EXPECT_EQ(stored->segments[0].tensor, t.segments[0].tensor) << t.name;
        }
      }
      // The steps: a storage each, the experts' apart from the dense ones'.
      std::set<std::string> keys;
      for (const auto& s : state->storages) EXPECT_TRUE(keys.insert(s.key).second) << s.key;
    }
  }
}

TEST(MegatronMoeOptimizer, TheExpertGroupsSettingsAreKeptAndRenderedBack) {
  // A save whose expert-parallel group has settings of its own (here an lr): import keeps them
  // by Megatron's group (OptimizerMeta::expert_groups), the manifest carries them, and both the
  // legacy render and torch_dist's common part give them back; the dense groups keep theirs.
  const ModelSpec spec = testing::Spec("llama", kMoeDims, DType::kBF16, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  const RankView view = *LayoutView(spec, config, 1);
  RankState saved = *BuildRankState(spec, config, view, MegatronState{}, NameSet::kLocal);
  Value& expert_group = saved.root.Find("optimizer")->items()[1].Find("optimizer")->Find("param_groups")->items()[0];
  expert_group.Set("lr", Value::Float(7e-4));
  const auto layout = ReadOptimizerLayout(view, *saved.root.Find("optimizer"), "f.pt");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  MegatronState state;
  state.optimizer.groups = GroupSettings(*layout, *saved.root.Find("optimizer"));
  state.optimizer.expert_groups = ExpertGroupSettings(*layout, *saved.root.Find("optimizer"));
  ASSERT_EQ(state.optimizer.expert_groups.items().size(), 2u);
  EXPECT_TRUE(state.optimizer.expert_groups.items()[1].is_none());  // the experts have no 1-D parameter
  EXPECT_EQ(state.optimizer.expert_groups.items()[0].Find("params"), nullptr);
  // Through the manifest.
  const nlohmann::json extra = {{std::string(kManifestKey), EncodeMegatronState(state)}};
  auto loaded = LoadMegatronState(extra, "manifest");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->optimizer.expert_groups == state.optimizer.expert_groups);
  auto lr = [](const Value& group) { return group.Find("lr")->as_float(); };
  // The legacy render: the experts' group with its lr, the dense ones with theirs.
  const RankState again = *BuildRankState(spec, config, view, *loaded, NameSet::kLocal);
  const Value& chain = *again.root.Find("optimizer");
  EXPECT_EQ(lr(chain.items()[1].Find("optimizer")->Find("param_groups")->items()[0]), 7e-4);
  EXPECT_TRUE(
      chain.items()[1].Find("optimizer")->Find("param_groups")->items()[0].Find("is_expert_parallel")->as_bool());
  EXPECT_EQ(lr(chain.items()[0].Find("optimizer")->Find("param_groups")->items()[0]), 1e-3);
  // torch_dist's common part, and read back from it.
  std::vector<CarriedTensor> storages;
  auto common = McoreOptimizerCommon(*loaded, /*masters=*/true, &storages, {0});
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  EXPECT_EQ(lr(common->Find(Value::Int(1))->Find("optimizer")->Find("param_groups")->items()[0]), 7e-4);
  auto read = [&](const pickle::Tensor& t) -> Result<std::string> {
    for (const CarriedTensor& c : storages) {
      if (c.key == t.storage_key) return c.bytes;
    }
    return NotFoundError(t.storage_key);
  };
  auto part = ReadMcoreOptimizerCommon(*common, {"p"}, read, "common.pt");
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_TRUE(part->meta.expert_groups == state.optimizer.expert_groups);
  // A manifest whose expert_groups are no two groups is refused naming the field.
  nlohmann::json bad = extra;
  bad[std::string(kManifestKey)]["optimizer"]["expert_groups"] = "8002292e";  // a pickled empty tuple
  auto refused = LoadMegatronState(bad, "manifest");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "optimizer.expert_groups")) << refused.status().message();
}

TEST(MegatronMoeOptimizer, ATorchDistCommonPartFromARankWithoutExpertsKeepsTheirGroupsSettings) {
  // dist_checkpointing.save writes common.pt from rank 0; with a dense first stage (dense_first)
  // its ChainedOptimizer's expert part is one group without parameters, whose settings
  // megatron-core 0.16.1 makes from every rank's group keys (_get_param_groups: params []) and
  // the scheduler steps like the others': they are the experts' group's, and are kept.
  Value group = Value::Dict();
  group.Set("params", Value::List());
  group.Set("lr", Value::Float(7e-4));
  group.Set("weight_decay", Value::Float(0.1));
  group.Set("wd_mult", Value::Float(1.0));
  group.Set("is_expert_parallel", Value::Bool(true));
  MegatronState state;
  state.iteration = 7;
  std::vector<CarriedTensor> storages;
  Value common = *McoreOptimizerCommon(state, /*masters=*/true, &storages, {0});
  common.Find(Value::Int(1))->Find("optimizer")->Find("param_groups")->items() = {group};
  auto read = [&](const pickle::Tensor& t) -> Result<std::string> {
    for (const CarriedTensor& c : storages) {
      if (c.key == t.storage_key) return c.bytes;
    }
    return NotFoundError(t.storage_key);
  };
  auto part = ReadMcoreOptimizerCommon(common, {"p"}, read, "common.pt");
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  ASSERT_EQ(part->meta.expert_groups.items().size(), 2u);
  EXPECT_EQ(part->meta.expert_groups.items()[0].Find("lr")->as_float(), 7e-4);
  EXPECT_EQ(part->meta.expert_groups.items()[0].Find("params"), nullptr);
  EXPECT_TRUE(part->meta.expert_groups.items()[1].is_none());
}

TEST(MegatronMoeOptimizer, AtEpOneTheExpertsShareTheDenseOptimizer) {
  // Megatron-Core's experts are expert-parallel (param.allreduce False) only with ep > 1.
  const ModelSpec spec = testing::Spec("llama", kMoeDims, DType::kF32, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=2");
  const RankView view = *LayoutView(spec, config, 1);
  const RankState state = *BuildRankState(spec, config, view, MegatronState{}, NameSet::kLocal);
  ASSERT_TRUE(state.root.Find("optimizer")->is_dict());
  const Value& groups = *state.root.Find("optimizer")->Find("optimizer")->Find("param_groups");
  ASSERT_EQ(groups.items().size(), 2u);
  size_t params = 0;
  for (const Value& g : groups.items()) {
    EXPECT_FALSE(g.Find("is_expert_parallel")->as_bool());
    params += g.Find("params")->items().size();
  }
  EXPECT_EQ(params, view.model.size());
  auto root = pickle::Unpickle(pickle::Pickle(state.root), "test");
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(FindRankTensors(spec, config, view, *root, "f.pt").ok());
}

TEST(MegatronMoeOptimizer, AChainOfAnotherShapeIsRefusedNamingIt) {
  const ModelSpec spec = testing::Spec("llama", kMoeDims, DType::kF32, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  const RankView view = *LayoutView(spec, config, 0);
  RankState state = *BuildRankState(spec, config, view, MegatronState{}, NameSet::kLocal);
  Value one = state.root;
  one.Find("optimizer")->items().pop_back();
  auto r = ReadOptimizerLayout(view, *one.Find("optimizer"), "f.pt");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "f.pt: optimizer: a list of 1 optimizers")) << r.status().message();
  // The experts' group one parameter short.
  Value shorter = state.root;
  shorter.Find("optimizer")
      ->items()[1]
      .Find("optimizer")
      ->Find("param_groups")
      ->items()[0]
      .Find("params")
      ->items()
      .pop_back();
  auto s = ReadOptimizerLayout(view, *shorter.Find("optimizer"), "f.pt");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(),
                       "f.pt: optimizer/1/optimizer/param_groups/0/params: 7 parameters, 8 "
                       "expected"))
      << s.status().message();
  EXPECT_TRUE(Contains(s.status().message(), "(the expert-parallel optimizer's)")) << s.status().message();
}

TEST(MegatronMoeTorchDist, ExpertsAreStackedOverLayersAndExpertsAsSequentialMlpSavesThem) {
  // Keys as megatron-core 0.16.1's SequentialMLP.sharded_state_dict and the local spec's
  // sharded_state_dict_keys_map make them (read from a save of the model of mcore_moe.py).
  const std::vector<TensorRecord> records = {
      TensorRecord{"decoder.layers.0.mlp.linear_fc1.layer_norm_weight", DType::kF32, {16}},
      TensorRecord{"decoder.layers.1.pre_mlp_layernorm.weight", DType::kF32, {16}},
      TensorRecord{"decoder.layers.1.mlp.router.weight", DType::kF32, {4, 16}},
      TensorRecord{"decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", DType::kF32, {16, 16}},
      TensorRecord{"decoder.layers.1.mlp.shared_experts.linear_fc2.weight", DType::kF32, {16, 8}}};
  const std::vector<dcp::Tensor> named = dcp::NameTensors(records, dcp::Keys::kMegatronCore);
  ASSERT_EQ(named.size(), records.size());
  EXPECT_EQ(named[0].key, "decoder.layers.mlp.linear_fc1.layer_norm_weight");
  EXPECT_EQ(named[1].key, "decoder.layers.mlp.linear_fc1.layer_norm_weight");  // an MoE layer's norm: the same key
  EXPECT_EQ(named[1].layer, 1);
  EXPECT_EQ(named[2].key, "decoder.layers.mlp.router.weight");
  EXPECT_EQ(named[3].key, "decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(named[3].layer, 1);
  EXPECT_EQ(named[3].expert, 3);
  EXPECT_EQ(dcp::KeyShape(named[3]), (Shape{2, 4, 16, 16}));
  EXPECT_EQ(dcp::KeyBox(named[3], Box{{8, 0}, {16, 16}}).ToString(), (Box{{1, 3, 8, 0}, {2, 4, 16, 16}}.ToString()));
  EXPECT_EQ(named[4].key, "decoder.layers.mlp.shared_experts.linear_fc2.weight");
  EXPECT_EQ(named[4].expert, -1);
}

TEST(MegatronMoeTorchDist, TheChainedOptimizersKeysArePrefixedByOptimizerAtEpAboveOne) {
  // megatron-core 0.16.1's ChainedOptimizer.sharded_state_dict (two optimizers, Megatron-LM's
  // metadata or none): add_prefix_for_sharding(chained_N.) over each optimizer's
  // optim_state_to_sharding_state keys; the model's keys have no prefix.
  const std::vector<TensorRecord> records = {
      TensorRecord{"decoder.layers.1.mlp.router.weight", DType::kBF16, {4, 16}},
      TensorRecord{"decoder.layers.1.mlp.router.weight.exp_avg", DType::kF32, {4, 16}},
      TensorRecord{"decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", DType::kBF16, {16, 16}},
      TensorRecord{"decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight.exp_avg_sq", DType::kF32, {16, 16}},
      TensorRecord{"decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight.fp32", DType::kF32, {16, 16}}};
  const std::vector<dcp::Tensor> chained = dcp::NameTensors(records, dcp::Keys::kMegatronCore, /*chained=*/true);
  ASSERT_EQ(chained.size(), records.size());
  EXPECT_EQ(chained[0].key, "decoder.layers.mlp.router.weight");
  EXPECT_EQ(chained[1].key, "chained_0.optimizer.state.exp_avg.decoder.layers.mlp.router.weight");
  EXPECT_EQ(chained[2].key, "decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(chained[3].key,
            "chained_1.optimizer.state.exp_avg_sq.decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(chained[4].key,
            "chained_1.optimizer.state.fp32_param.decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(dcp::KeyShape(chained[4]), (Shape{2, 4, 16, 16}));  // stacked as the parameter
  // At ep = 1 one optimizer: no prefix; a model without experts never has one.
  const std::vector<dcp::Tensor> one = dcp::NameTensors(records, dcp::Keys::kMegatronCore);
  EXPECT_EQ(one[3].key, "optimizer.state.exp_avg_sq.decoder.layers.mlp.experts.experts.linear_fc1.weight");
  const std::vector<TensorRecord> dense = {records[0], records[1]};
  EXPECT_EQ(dcp::NameTensors(dense, dcp::Keys::kMegatronCore, true)[1].key,
            "optimizer.state.exp_avg.decoder.layers.mlp.router.weight");
  EXPECT_EQ(dcp::WithoutChainedPrefix(chained[3].key).first, one[3].key);
  EXPECT_EQ(dcp::WithoutChainedPrefix(chained[3].key).second, 1);
  EXPECT_EQ(dcp::WithoutChainedPrefix("chained_2.optimizer.x").second, -1);
  EXPECT_EQ(dcp::WithoutChainedPrefix("chained_0").second, -1);
  // The plan of such a store: its extra-state objects are the model's only (none for an optimizer key).
  GenerationManifest m;
  m.tensors = {records[2], records[3], records[4]};
  for (const TensorRecord& t : m.tensors) m.shards.push_back(ShardRecord{t.name, {Box::Full(t.shape)}, 0, "f"});
  auto plan = dcp::PlanCheckpoint(m, dcp::Keys::kMegatronCore, true);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  for (const dcp::Object& o : plan->objects) {
    EXPECT_FALSE(Contains(o.key, "optimizer")) << o.key;
  }
}

// megatron-core 0.16.1's TE spec (get_gpt_layer_with_transformer_engine_spec with experts)
// makes an MoE layer's pre_mlp_layernorm a TENorm module of its own and maps no key of it, so
// its torch_dist key is decoder.layers.pre_mlp_layernorm.weight, where the local spec's
// sharded_state_dict_keys_map names it decoder.layers.mlp.linear_fc1.layer_norm_weight. The
// mount renders both (each spec's load finds its own); a save in either is taken, and a
// tree with both (as rendered) reads the local spec's.
TEST(MegatronMoeTorchDist, AnMoeLayersNormHasTheTeSpecsKeyTooAndSavesInEitherAreTaken) {
  testing::TempDir tmp;
  Env* env = Env::Default();
  const ModelSpec spec = testing::Spec("llama", kMoeDims, DType::kF32, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, testing::FitLayout(spec, config), 3, tmp.path() + "/src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp.path() + "/src", tmp.path() + "/store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp.path() + "/store")).value();
  auto plan = dcp::PlanCheckpoint(*store->CurrentSnapshot(), dcp::Keys::kMegatronCore, /*chained=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, std::set<std::string>> names_of;  // key -> the tensors it renders
  for (const dcp::Tensor& t : plan->tensors) names_of[t.key].insert(t.name);
  const std::set<std::string> norms = {"decoder.layers.0.pre_mlp_layernorm.weight",
                                       "decoder.layers.1.pre_mlp_layernorm.weight"};
  EXPECT_EQ(names_of["decoder.layers.mlp.linear_fc1.layer_norm_weight"], norms);
  EXPECT_EQ(names_of["decoder.layers.pre_mlp_layernorm.weight"], norms);
  EXPECT_EQ(names_of["chained_0.optimizer.state.exp_avg.decoder.layers.pre_mlp_layernorm.weight"].size(), 2u);
  EXPECT_EQ(names_of.count("decoder.layers.pre_mlp_layernorm.bias"), 0u);
  EXPECT_EQ(names_of.count("decoder.layers.self_attention.linear_qkv.layer_norm_weight"), 1u);  // no alias
  // Exported (both keys), read back: the local spec's keys are taken, the TE spec's passed over.
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, store->CurrentSnapshot(), tmp.path() + "/both", {},
                               dcp::Keys::kMegatronCore)
                  .ok());
  auto both = dcp::OpenDcp(env, tmp.path() + "/both", spec.schema, spec.dims, config, dcp::Keys::kMegatronCore);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  // A TE spec's save: the same files, its metadata without the local spec's keys of the norms.
  dcp::Plan te = *dcp::PlanCheckpoint(*store->CurrentSnapshot(), dcp::Keys::kMegatronCore);  // as ExportDcp's
  std::vector<int64_t> index(te.tensors.size(), -1);
  std::vector<dcp::Tensor> kept;
  for (size_t t = 0; t < te.tensors.size(); ++t) {
    if (!dcp::TeSpecNormKey(te.tensors[t]).empty()) continue;  // the local spec's key of a norm
    index[t] = static_cast<int64_t>(kept.size());
    kept.push_back(te.tensors[t]);
  }
  te.tensors = std::move(kept);
  for (dcp::File& f : te.files) {
    std::erase_if(f.chunks, [&](const dcp::Chunk& c) { return c.object < 0 && index[c.tensor] < 0; });
    for (dcp::Chunk& c : f.chunks) {
      if (c.object < 0) c.tensor = static_cast<size_t>(index[c.tensor]);
    }
  }
  const std::string metadata = dcp::EncodeMetadata(te);
  EXPECT_FALSE(testing::Contains(metadata, "decoder.layers.mlp.linear_fc1.layer_norm_weight"));
  auto te_save = dcp::OpenDcpPart(env, tmp.path() + "/both", metadata, spec.schema, spec.dims, config,
                                  dcp::Keys::kMegatronCore, /*part=*/false);
  ASSERT_TRUE(te_save.ok()) << te_save.status().ToString();
  // Both read every tensor, the norms included, as the same bytes (each chunk's, by box).
  auto bytes = [](const dcp::DcpSource& s) {
    std::map<std::string, std::map<std::string, std::string>> out;  // tensor -> box -> bytes
    for (const auto& c : s.chunks) {
      std::string b(c.size, '\0');
      EXPECT_TRUE(s.files[c.file]->Read(c.offset, c.size, b.data()).ok());
      out[c.tensor][c.box.ToString()] = std::move(b);
    }
    return out;
  };
  const auto from_both = bytes(*both), from_te = bytes(*te_save);
  EXPECT_EQ(from_both.size(), store->current().tensors.size());
  EXPECT_TRUE(from_te == from_both);
  for (const std::string& norm : norms) EXPECT_EQ(from_te.count(norm), 1u) << norm;
}

// common.pt's 'optimizer' of ChainedOptimizer's dense and expert-parallel parts, as
// dist_checkpointing.save leaves them: {0: {...}, 1: {...}} by optimizer index.
TEST(MegatronMoeTorchDist, TheCommonPartIsTheChainsByIndexAndReadsBackFromTheDenseOne) {
  MegatronState state;
  state.iteration = 7;
  std::vector<CarriedTensor> storages;
  auto common = McoreOptimizerCommon(state, /*masters=*/true, &storages, /*expert_groups=*/{0});
  ASSERT_TRUE(common.ok()) << common.status().message();
  ASSERT_EQ(common->pairs().size(), 2u);
  EXPECT_EQ(common->pairs()[0].first.as_int(), 0);
  EXPECT_EQ(common->pairs()[1].first.as_int(), 1);
  const Value* dense_groups = common->Find(Value::Int(0))->Find("optimizer")->Find("param_groups");
  const Value* expert_groups = common->Find(Value::Int(1))->Find("optimizer")->Find("param_groups");
  ASSERT_EQ(dense_groups->items().size(), 2u);
  ASSERT_EQ(expert_groups->items().size(), 1u);  // the experts' weights: the group with weight decay only
  EXPECT_FALSE(dense_groups->items()[0].Find("is_expert_parallel")->as_bool());
  EXPECT_TRUE(expert_groups->items()[0].Find("is_expert_parallel")->as_bool());
  EXPECT_EQ(expert_groups->items()[0].Find("wd_mult")->DebugString(),
            dense_groups->items()[0].Find("wd_mult")->DebugString());
  // Both steps are float32 7 (the iteration), one storage.
  ASSERT_EQ(storages.size(), 1u);
  auto read = [&](const pickle::Tensor& t) -> Result<std::string> {
    for (const CarriedTensor& c : storages) {
      if (c.key == t.storage_key) return c.bytes;
    }
    return NotFoundError(t.storage_key);
  };
  const std::vector<std::string> params = {"p"};
  auto part = ReadMcoreOptimizerCommon(*common, params, read, "common.pt");
  ASSERT_TRUE(part.ok()) << part.status().message();
  ASSERT_EQ(part->meta.groups.items().size(), 2u);
  EXPECT_FALSE(part->meta.groups.items()[0].Find("is_expert_parallel")->as_bool());
  ASSERT_EQ(part->meta.steps.size(), 1u);
  EXPECT_EQ(part->meta.steps[0].tensors.at(0).bytes, storages[0].bytes);
  // Steps that differ, and keys that are no chain, are refused naming the entry.
  Value differ = *common;
  differ.Find(Value::Int(1))->Find("optimizer")->Find("state")->Set("common_step", Value::Int(3));
  auto refused = ReadMcoreOptimizerCommon(differ, params, read, "common.pt");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "common.pt: optimizer/1: its common_step differs"))
      << refused.status().message();
  Value three = *common;
  three.pairs().emplace_back(Value::Int(2), common->pairs()[1].second);
  refused = ReadMcoreOptimizerCommon(three, params, read, "common.pt");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "keys are not 0 and 1")) << refused.status().message();
  // Without expert groups: one optimizer's part, as before.
  storages.clear();
  auto plain = McoreOptimizerCommon(state, true, &storages);
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->Find("optimizer"), nullptr);
}

}  // namespace
}  // namespace ptc::megatron
