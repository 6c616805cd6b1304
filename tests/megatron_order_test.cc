// The parameter order of a rank file (docs/megatron_format.md, "The parameter order" and
// "Two name sets"): rendered files hold the model dict in the registration order of the
// name set they use, and their optimizer state numbered in it; a file of either set
// reads back to the same tensors; names mixing the sets, or parameters in another order
// (with optimizer state), are refused naming the tensor; a store whose manifest holds
// an older schema order renders in that order.
#include <gtest/gtest.h>

#include <map>

#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/store/model_spec.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using ::ptc::testing::LayoutView;

using pickle::Value;
using ::ptc::testing::Contains;

const char* kDims = "layers=4,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=16";

// The keys of the model dict of a rendered (flat) state dict, in order.
std::vector<std::string> ModelKeys(const Value& root) {
  std::vector<std::string> out;
  for (const auto& [k, v] : root.Find("model")->pairs()) out.push_back(k.as_str());
  return out;
}

// The parameter each optimizer state number k belongs to (by the local tensor in the
// storage of its exp_avg and of its fp32 master, which must agree), in k's order.
std::vector<std::string> Numbered(const RankState& state) {
  std::map<std::string, std::string> tensor_of;  // storage key -> local tensor name
  for (const auto& s : state.storages) {
    if (s.tensor != nullptr) tensor_of[s.key] = s.tensor->name;
  }
  const Value& optimizer = *state.root.Find("optimizer");
  const Value& groups = *optimizer.Find("optimizer")->Find("param_groups");
  std::map<int64_t, std::string> by_number;
  for (size_t g = 0; g < groups.items().size(); ++g) {
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

// Megatron's numbering of a model dict's parameters: those with weight decay in the
// dict's order, then the 1-D ones and biases.
std::vector<std::string> MegatronNumbering(const Value& root) {
  std::vector<std::string> decay, none;
  for (const auto& [k, v] : root.Find("model")->pairs()) {
    if (!v.is_tensor()) continue;
    (v.tensor().shape.size() == 1 || k.as_str().ends_with(".bias") ? none : decay).push_back(k.as_str());
  }
  decay.insert(decay.end(), none.begin(), none.end());
  return decay;
}

TEST(MegatronOrder, EachNameSetRendersInItsOrderAndReadsBack) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  for (NameSet names : {NameSet::kTe, NameSet::kLocal}) {
    for (int rank = 0; rank < config.world_size(); ++rank) {
      SCOPED_TRACE(std::string(NameSetName(names)) + " rank " + std::to_string(rank));
      const RankView view = *LayoutView(spec, config, rank);
      auto state = BuildRankState(spec, config, view, MegatronState{}, names);
      ASSERT_TRUE(state.ok()) << state.status().ToString();
      // The model dict: the set's names in its registration order.
      std::vector<std::string> want;
      for (const LocalTensor& t : ViewInNameSet(view, names).model) want.push_back(t.name);
      EXPECT_EQ(ModelKeys(state->root), want);
      if (names == NameSet::kLocal && view.coords.pp == 0) {
        EXPECT_EQ(want[1], "decoder.layers.0.input_layernorm.weight");
        EXPECT_EQ(want[2], "decoder.layers.0.self_attention.linear_proj.weight");
      }
      // The optimizer state numbered in that order, split into Megatron's groups.
      EXPECT_EQ(Numbered(*state), MegatronNumbering(state->root));
      // Read back (through a pickle round trip): every tensor of the schema's view.
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
          EXPECT_EQ(stored->shape, t.shape) << t.name;
        }
      }
    }
  }
}

// A rendered rank 0 file of `names` (tp=1, pp=1), pickled and read back.
Value Rendered(const ModelSpec& spec, NameSet names) {
  const RankView view = *LayoutView(spec, *ParseConfig("tp=1"), 0);
  return *pickle::Unpickle(
      pickle::Pickle(BuildRankState(spec, *ParseConfig("tp=1"), view, MegatronState{}, names)->root), "test");
}

// `root` with the model dict's entries `a` and `b` swapped in place (keys and values).
Value Swapped(Value root, const std::string& a, const std::string& b) {
  auto& pairs = root.Find("model")->pairs();
  size_t ia = pairs.size(), ib = pairs.size();
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (pairs[i].first.as_str() == a) ia = i;
    if (pairs[i].first.as_str() == b) ib = i;
  }
  EXPECT_LT(ia, pairs.size());
  EXPECT_LT(ib, pairs.size());
  std::swap(pairs[ia], pairs[ib]);
  return root;
}

TEST(MegatronOrder, AnotherOrderOrMixedNamesAreRefusedNamingTheTensor) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kF32, /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=1");
  const RankView view = *LayoutView(spec, config, 0);
  RankView model_only = view;
  model_only.optim.clear();
  auto error = [&](const RankView& v, const Value& root) {
    auto found = FindRankTensors(spec, config, v, root, "f.pt");
    return found.ok() ? std::string("accepted") : found.status().message();
  };
  // The te order (linear_proj first) in local names, as a model would if it registered so:
  // its optimizer state is numbered so too, which no local model does.
  const Value local = Rendered(spec, NameSet::kLocal);
  const Value misordered =
      Swapped(local, "decoder.layers.1.input_layernorm.weight", "decoder.layers.1.self_attention.linear_proj.weight");
  EXPECT_TRUE(Contains(error(view, misordered),
                       "f.pt: model/decoder.layers.1.self_attention.linear_proj.weight: the rank's parameter 7 in "
                       "the file's order, where the schema's order in local names has "
                       "decoder.layers.1.input_layernorm.weight"))
      << error(view, misordered);
  // Without optimizer state the order numbers nothing: the tensors are found by name.
  EXPECT_EQ(error(model_only, misordered), "accepted");
  // The te file in Megatron-Core's earlier llama order (linear_qkv before linear_proj).
  const Value te = Rendered(spec, NameSet::kTe);
  const Value old = Swapped(Swapped(te, "decoder.layers.0.self_attention.linear_proj.weight",
                                    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"),
                            "decoder.layers.0.self_attention.linear_proj.weight",
                            "decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_TRUE(Contains(error(view, old),
                       "f.pt: model/decoder.layers.0.self_attention.linear_qkv.layer_norm_weight: the rank's "
                       "parameter 1 in the file's order, where the schema's order in te names has "
                       "decoder.layers.0.self_attention.linear_proj.weight"))
      << error(view, old);
  // One norm in the other set's name: named, with or without optimizer state.
  Value mixed = local;
  for (auto& [k, v] : mixed.Find("model")->pairs()) {
    if (k.as_str() == "decoder.layers.2.pre_mlp_layernorm.weight")
      k = Value::Str("decoder.layers.2.mlp.linear_fc1.layer_norm_weight");
  }
  for (const RankView* v : {&view, static_cast<const RankView*>(&model_only)}) {
    EXPECT_TRUE(Contains(error(*v, mixed),
                         "f.pt: model/decoder.layers.2.mlp.linear_fc1.layer_norm_weight: in Transformer Engine's "
                         "names (te), but f.pt: model/decoder.layers.0.input_layernorm.weight is in the local "
                         "spec's names (local)"))
        << error(*v, mixed);
  }
}

// Issue 26: a store written before the llama order changed holds the schema it was made
// with in its manifest, rules in the old order (no statement of order: the rules' order is
// it). It renders in that order still, as it did; so does each name set.
TEST(MegatronOrder, AStoreOfAnOlderSchemaOrderRendersInThatOrder) {
  ModelSpec older = testing::Spec("llama", kDims, DType::kF32, /*optimizer=*/true);
  auto& rules = older.schema.rules;  // before: linear_qkv's norm, linear_qkv, then linear_proj
  const auto proj = std::find_if(rules.begin(), rules.end(), [](const TensorRule& r) {
    return r.name == "decoder.layers.{i}.self_attention.linear_proj.weight";
  });
  ASSERT_TRUE(proj != rules.end() && proj + 2 < rules.end());
  ASSERT_EQ((proj + 2)->name, "decoder.layers.{i}.self_attention.linear_qkv.weight");
  std::rotate(proj, proj + 1, proj + 3);
  ASSERT_EQ((proj + 2)->name, "decoder.layers.{i}.self_attention.linear_proj.weight");
  GenerationManifest m;
  m.generation = 3;
  ASSERT_TRUE(DescribeModel(older, *ParseConfig("tp=2"), &m).ok());
  auto decoded = DecodeManifest("manifest.json", EncodeManifest(m));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  auto spec = SpecFromManifest(*decoded);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->schema.name, "llama");
  const ParallelConfig config = *ParseConfig("tp=2");
  const RankView view = *LayoutView(*spec, config, 1);
  auto te = BuildRankState(*spec, config, view, MegatronState{}, NameSet::kTe);
  ASSERT_TRUE(te.ok());
  const std::vector<std::string> keys = ModelKeys(te->root);
  ASSERT_GE(keys.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(keys.begin() + 1, keys.begin() + 4),
            (std::vector<std::string>{"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                                      "decoder.layers.0.self_attention.linear_qkv.weight",
                                      "decoder.layers.0.self_attention.linear_proj.weight"}));
  EXPECT_EQ(Numbered(*te), MegatronNumbering(te->root));
  // Local names: the norm already leads its attention; the rest keeps the stored order.
  auto local = BuildRankState(*spec, config, view, MegatronState{}, NameSet::kLocal);
  ASSERT_TRUE(local.ok());
  const std::vector<std::string> local_keys = ModelKeys(local->root);
  EXPECT_EQ(std::vector<std::string>(local_keys.begin() + 1, local_keys.begin() + 4),
            (std::vector<std::string>{"decoder.layers.0.input_layernorm.weight",
                                      "decoder.layers.0.self_attention.linear_qkv.weight",
                                      "decoder.layers.0.self_attention.linear_proj.weight"}));
  EXPECT_EQ(Numbered(*local), MegatronNumbering(local->root));
  // Its own files read back; the built-in order's are refused by it, naming the tensor.
  auto root = pickle::Unpickle(pickle::Pickle(te->root), "test");
  EXPECT_TRUE(FindRankTensors(*spec, config, view, *root, "f.pt").ok());
  const ModelSpec builtin = testing::Spec("llama", kDims, DType::kF32, /*optimizer=*/true);
  root = pickle::Unpickle(
      pickle::Pickle(BuildRankState(builtin, config, *LayoutView(builtin, config, 1), MegatronState{})->root), "test");
  auto refused = FindRankTensors(*spec, config, view, *root, "f.pt");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(),
                       "f.pt: model/decoder.layers.0.self_attention.linear_proj.weight: the rank's parameter 1"))
      << refused.status().message();
}

}  // namespace
}  // namespace ptc::megatron
