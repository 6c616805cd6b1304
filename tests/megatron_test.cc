// The Megatron checkpoint layout (ptc/checkpoint/megatron/megatron.h): directory names, where each
// tensor sits in the state dict, and that the state dict of a rank finds back
// exactly its view's tensors (model, and optimizer state with and without
// ZeRO-1), with the kept entries carried and their parallel sizes rewritten.
#include "ptc/checkpoint/megatron/megatron.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>

#include "ptc/checkpoint/megatron/optimizer.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using ::ptc::testing::LayoutView;

using pickle::Value;

TEST(MegatronNames, DirectoriesRoundTrip) {
  EXPECT_EQ(IterationDirName(100), "iter_0000100");
  EXPECT_EQ(RankDirName(1, 0, 1), "mp_rank_01");
  EXPECT_EQ(RankDirName(3, 2, 4), "mp_rank_03_002");
  auto d = ParseRankDirName("mp_rank_03_002");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tp_rank, 3);
  EXPECT_EQ(d->pp_rank, 2);
  EXPECT_EQ(ParseRankDirName("mp_rank_07")->pp_rank, -1);
  for (const char* bad : {"mp_rank_7", "mp_rank_07_2", "mp_rank_07_002_1", "rank_07", "mp_rank_0a"}) {
    EXPECT_FALSE(ParseRankDirName(bad).ok()) << bad;
  }
}

TEST(MegatronNames, KeyPathsNestLikeMegatron) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ModelKeyPath("megatron-gpt", "language_model.embedding.word_embeddings.weight"),
            (V{"model", "language_model", "embedding", "word_embeddings", "weight"}));
  EXPECT_EQ(ModelKeyPath("megatron-gpt", "language_model.encoder.layers.3.mlp.dense_h_to_4h.bias"),
            (V{"model", "language_model", "encoder", "layers.3.mlp.dense_h_to_4h.bias"}));
  EXPECT_EQ(ModelKeyPath("megatron-gpt", "word_embeddings_for_head.weight"),
            (V{"model", "word_embeddings_for_head", "weight"}));
  EXPECT_EQ(ModelKeyPath("llama", "decoder.layers.0.mlp.linear_fc1.weight"),
            (V{"model", "decoder.layers.0.mlp.linear_fc1.weight"}));
}

// A Namespace as argparse pickles it.
Value Namespace(int tp, int pp) {
  pickle::Object o;
  o.callable = {"argparse", "Namespace"};
  o.build = pickle::Object::Build::kNewObj;
  Value state = Value::Dict();
  state.Set("tensor_model_parallel_size", Value::Int(tp));
  state.Set("pipeline_model_parallel_size", Value::Int(pp));
  state.Set("lr", Value::Float(3e-4));
  o.state = pickle::Boxed<Value>(std::move(state));
  return Value::FromObject(std::move(o));
}

TEST(MegatronState, FindsBackEveryTensorOfEveryRank) {
  for (const char* schema : {"megatron-gpt", "llama"}) {
    for (const char* cfg : {"tp=2,pp=2", "tp=2,pp=2,dp=2,zero=1", "tp=1,pp=3,pp_layers=1+1+2"}) {
      const std::string dims = std::string(schema) == "llama"
                                   ? "layers=4,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=16"
                                   : "layers=4,hidden=32,heads=4,vocab=64,seq=16";
      const ModelSpec spec = testing::Spec(schema, dims, DType::kBF16, /*optimizer=*/true);
      const ParallelConfig config = *ParseConfig(cfg);
      Value carried = Value::Dict();
      carried.Set("args", Namespace(8, 8));
      carried.Set("rng_state", Value::List({Value::Str("kept")}));
      for (int rank = 0; rank < config.world_size(); ++rank) {
        SCOPED_TRACE(std::string(schema) + " " + cfg + " rank " + std::to_string(rank));
        const RankView view = *LayoutView(spec, config, rank);
        const MegatronState kept{42, carried, {{"c0", DType::kU8, 3, "abc"}}};
        auto state = BuildRankState(spec, config, view, kept);
        ASSERT_TRUE(state.ok()) << state.status().ToString();
        const bool optim = config.zero == 0;  // ZeRO-1 state is not in these files
        // Each Adam state's step has a storage of its own (Adam adds to it in place).
        const size_t steps = optim ? view.model.size() : 0;
        ASSERT_EQ(state->storages.size(), view.model.size() + (optim ? view.optim.size() : 0) + steps + 1);
        std::map<std::string, const RankState::Storage*> by_key;
        for (const auto& st : state->storages) by_key[st.key] = &st;
        ASSERT_EQ(by_key.size(), state->storages.size()) << "storage keys repeat";
        EXPECT_EQ(by_key.at("c0")->carried, &kept.tensors[0]);
        // Through a pickle round trip, as a reader of the file sees it.
        auto root = pickle::Unpickle(pickle::Pickle(state->root), "test");
        ASSERT_TRUE(root.ok()) << root.status().ToString();
        RankView model_only = view;
        if (!optim) model_only.optim.clear();
        auto found = FindRankTensors(spec, config, model_only, *root, "test");
        ASSERT_TRUE(found.ok()) << found.status().ToString();
        ASSERT_EQ(found->size(), state->storages.size() - 1 - steps);
        // The i-th tensor found is the storage that holds that local tensor.
        std::vector<const LocalTensor*> order;
        for (const auto* list : {&model_only.model, &model_only.optim}) {
          for (const LocalTensor& t : *list) order.push_back(&t);
        }
        for (size_t i = 0; i < order.size(); ++i) {
          const RankState::Storage* st = by_key.at((*found)[i].storage_key);
          ASSERT_NE(st->tensor, nullptr);
          EXPECT_EQ(st->tensor->name, order[i]->name);
        }
        EXPECT_EQ(root->Find("iteration")->as_int(), 42);
        EXPECT_EQ(root->Find("rng_state")->items()[0].as_str(), "kept");
        const Value* args = root->Find("args");
        EXPECT_EQ(args->GetAttr("tensor_model_parallel_size")->as_int(), config.tp);
        EXPECT_EQ(args->GetAttr("pipeline_model_parallel_size")->as_int(), config.pp);
        EXPECT_EQ(args->GetAttr("data_parallel_size"), nullptr);  // not invented
        EXPECT_EQ(args->GetAttr("lr")->as_float(), 3e-4);
      }
    }
  }
}

// The word embedding's tensor in a legacy GPTModel checkpoint's value tree.
pickle::Tensor& EmbeddingWeight(Value& root) {
  return root.Find("model")
      ->Find("language_model")
      ->Find("embedding")
      ->Find("word_embeddings")
      ->Find("weight")
      ->tensor();
}

TEST(MegatronState, WrongTensorsAreNamed) {
  const ModelSpec spec = testing::Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16");
  const ParallelConfig config = *ParseConfig("tp=2");
  const RankView view = *LayoutView(spec, config, 0);
  Value root = BuildRankState(spec, config, view, MegatronState{})->root;
  Value* emb = root.Find("model")->Find("language_model")->Find("embedding")->Find("word_embeddings");
  auto expect_error = [&](const Value& r, const std::string& needle) {
    auto found = FindRankTensors(spec, config, view, r, "f.pt");
    ASSERT_FALSE(found.ok());
    EXPECT_NE(found.status().message().find(needle), std::string::npos) << found.status().message();
  };
  Value wrong = root;
  EmbeddingWeight(wrong).shape = {64, 32};
  expect_error(wrong,
               "f.pt: model/language_model/embedding/word_embeddings/weight: shape [64, 32], the schema and config say "
               "[32, 32]");
  wrong = root;
  EmbeddingWeight(wrong).dtype = DType::kF16;
  expect_error(wrong, "dtype F16, the schema says F32");
  wrong = root;
  wrong.Find("model")->Find("language_model")->Find("encoder")->Erase("layers.1.mlp.dense_4h_to_h.bias");
  expect_error(wrong, "f.pt: model/language_model/encoder/layers.1.mlp.dense_4h_to_h.bias: missing");
  wrong = root;
  emb = wrong.Find("model")->Find("language_model")->Find("embedding")->Find("word_embeddings");
  emb->Set("weight", Value::Int(3));
  expect_error(wrong, "a int, not a tensor");
  wrong = root;
  emb = wrong.Find("model")->Find("language_model")->Find("embedding")->Find("word_embeddings");
  std::swap(emb->Find("weight")->tensor().stride[0], emb->Find("weight")->tensor().stride[1]);
  expect_error(wrong, "not contiguous");
}

TEST(MegatronState, KeptEntriesRoundTripThroughTheManifest) {
  Value root = Value::Dict();
  root.Set("args", Namespace(2, 1));
  root.Set("model", Value::Dict());
  root.Set("optimizer", Value::Dict());
  root.Set("opt_param_scheduler", Value::Dict({{Value::Str("num_steps"), Value::Int(7)}}));
  const MegatronState state{300, CarriedEntries(root), {{"c0", DType::kI64, 2, std::string(16, '\x07')}}};
  EXPECT_EQ(state.carried.Find("model"), nullptr);
  EXPECT_EQ(state.carried.Find("optimizer"), nullptr);
  nlohmann::json extra = {{"megatron", EncodeMegatronState(state)}};
  auto back = LoadMegatronState(extra, "m.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->iteration, 300u);
  EXPECT_EQ(back->carried, state.carried);
  ASSERT_EQ(back->tensors.size(), 1u);
  EXPECT_EQ(back->tensors[0].bytes, state.tensors[0].bytes);
  EXPECT_EQ(back->tensors[0].dtype, DType::kI64);
  EXPECT_EQ(LoadMegatronState(nlohmann::json::object(), "m.json")->iteration, 0u);  // not from Megatron
  // Malformed records name the field.
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j["iteration"] = -1; }, "m.json: extra.megatron: 'iteration' must be"},
      {[](nlohmann::json& j) { j["carried"] = "abc"; }, "m.json: extra.megatron.carried: odd hex length"},
      {[](nlohmann::json& j) { j["carried"] = "zz"; }, "m.json: extra.megatron.carried: not hex at 0"},
      {[](nlohmann::json& j) { j["tensors"][0]["numel"] = 3u; },
       "extra.megatron.tensors[0]: 16 bytes for 3 elements of I64"},
      {[](nlohmann::json& j) { j["tensors"][0]["dtype"] = "Q8"; }, "extra.megatron.tensors[0]"},
      {[](nlohmann::json& j) { j["tensors"] = 5; }, "'tensors' must be an array"},
  };
  for (const auto& [damage, needle] : cases) {
    nlohmann::json bad = extra;
    damage(bad["megatron"]);
    auto r = LoadMegatronState(bad, "m.json");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
}

// A 0-dim float32 step tensor of storage "s" and its bytes.
StepValue Step(float value, std::vector<std::string> params) {
  pickle::Tensor t;
  t.storage_key = "s";
  t.dtype = DType::kF32;
  t.storage_numel = 1;
  std::string bytes(4, '\0');
  std::memcpy(bytes.data(), &value, 4);
  return {std::move(params), Value::FromTensor(std::move(t)), {{"s", DType::kF32, 1, bytes}}};
}

float StepOf(const RankState& state, const Value& step) {
  for (const auto& st : state.storages) {
    if (st.key == step.tensor().storage_key) {
      float f = 0;
      std::memcpy(&f, st.carried->bytes.data(), 4);
      return f;
    }
  }
  ADD_FAILURE() << "no storage " << step.tensor().storage_key;
  return -1;
}

TEST(MegatronOptimizer, RendersMegatronsTwoGroupsWithStepsAndSettings) {
  const ModelSpec spec = testing::Spec("megatron-gpt", "layers=4,hidden=32,heads=4,vocab=64,seq=16", DType::kBF16,
                                       /*optimizer=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  const RankView view = *LayoutView(spec, config, 0);
  MegatronState kept;
  kept.iteration = 90;
  for (double lr : {0.1, 0.2})
    kept.optimizer.groups.items().push_back(Value::Dict({{Value::Str("lr"), Value::Float(lr)}}));
  // Every parameter but the first has step 77 kept.
  std::vector<std::string> names;
  for (size_t i = 1; i < view.model.size(); ++i) names.push_back(view.model[i].segments[0].tensor);
  kept.optimizer.steps.push_back(Step(77, names));
  auto state = BuildRankState(spec, config, view, kept);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const Value& optimizer = *state->root.Find("optimizer");
  const Value& groups = *optimizer.Find("optimizer")->Find("param_groups");
  ASSERT_EQ(groups.items().size(), 2u);
  // Megatron's order: decay group first, keys consecutive across the groups in the view's order.
  std::vector<size_t> want[2];
  for (size_t i = 0; i < view.model.size(); ++i) want[WithoutWeightDecay(view.model[i]) ? 1 : 0].push_back(i);
  ASSERT_FALSE(want[0].empty());
  ASSERT_FALSE(want[1].empty());
  EXPECT_TRUE(WithoutWeightDecay(view.model[want[1][0]]));
  int64_t key = 0;
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(groups.items()[g].Find("lr")->as_float(), g == 0 ? 0.1 : 0.2);
    const Value& params = *groups.items()[g].Find("params");
    ASSERT_EQ(params.items().size(), want[g].size());
    ASSERT_EQ(optimizer.Find("fp32_from_fp16_params")->items()[g].items().size(), want[g].size());
    for (size_t j = 0; j < want[g].size(); ++j, ++key) {
      EXPECT_EQ(params.items()[j].as_int(), key);
      const Value& st = *optimizer.Find("optimizer")->Find("state")->Find(Value::Int(key));
      EXPECT_EQ(StepOf(*state, *st.Find("step")), want[g][j] == 0 ? 90.0f : 77.0f) << key;
      EXPECT_TRUE(st.Find("step")->tensor().shape.empty());
    }
  }
  // And the file reads back to the view's tensors through that layout.
  auto root = pickle::Unpickle(pickle::Pickle(state->root), "test");
  ASSERT_TRUE(root.ok());
  auto layout = ReadOptimizerLayout(view, *root->Find("optimizer"), "f.pt");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(GroupSettings(*layout, *root->Find("optimizer")), kept.optimizer.groups);
  // Without kept settings: torch Adam's defaults, no weight decay in group 1.
  kept.optimizer.groups = Value::List();
  const Value defaults = BuildRankState(spec, config, view, kept)
                             ->root.Find("optimizer")
                             ->Find("optimizer")
                             ->Find("param_groups")
                             ->items()[1];
  EXPECT_EQ(defaults.Find("lr")->as_float(), 1e-3);
  EXPECT_EQ(defaults.Find("wd_mult")->as_float(), 0.0);
}

TEST(MegatronOptimizer, ReadsEitherGroupOrderAndOneGroupAndNamesWrongSizes) {
  const ModelSpec spec = testing::Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16", DType::kF32,
                                       /*optimizer=*/true);
  const RankView view = *LayoutView(spec, *ParseConfig("tp=1"), 0);
  std::vector<size_t> decay, none;
  for (size_t i = 0; i < view.model.size(); ++i) (WithoutWeightDecay(view.model[i]) ? none : decay).push_back(i);
  auto ints = [](size_t from, size_t n) {
    Value l = Value::List();
    for (size_t i = 0; i < n; ++i) l.items().push_back(Value::Int(static_cast<int64_t>(from + i)));
    return l;
  };
  auto optimizer = [](Value groups) {
    Value inner = Value::Dict();
    inner.Set("param_groups", std::move(groups));
    Value o = Value::Dict();
    o.Set("optimizer", std::move(inner));
    return o;
  };
  // The group without weight decay first, named by its wd_mult.
  Value first = Value::Dict({{Value::Str("wd_mult"), Value::Float(0.0)}, {Value::Str("params"), ints(0, none.size())}});
  Value second = Value::Dict(
      {{Value::Str("wd_mult"), Value::Float(1.0)}, {Value::Str("params"), ints(none.size(), decay.size())}});
  auto layout = ReadOptimizerLayout(view, optimizer(Value::List({first, second})), "f.pt");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->file_groups, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(layout->slots[none[2]].group, 0u);
  EXPECT_EQ(layout->slots[none[2]].key.as_int(), 2);
  EXPECT_EQ(layout->slots[decay[1]].group, 1u);
  EXPECT_EQ(layout->slots[decay[1]].key.as_int(), static_cast<int64_t>(none.size() + 1));
  EXPECT_EQ(
      OptimizerPath(*layout, "fp32", decay[1]),
      (std::vector<Value>{Value::Str("optimizer"), Value::Str("fp32_from_fp16_params"), Value::Int(1), Value::Int(1)}));
  // One group: the model's order.
  layout = ReadOptimizerLayout(
      view, optimizer(Value::List({Value::Dict({{Value::Str("params"), ints(0, view.model.size())}})})), "f.pt");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->slots[3].key.as_int(), 3);
  // Sizes that are not Megatron's split are named.
  second.Set("params", ints(none.size(), decay.size() - 1));
  layout = ReadOptimizerLayout(view, optimizer(Value::List({first, second})), "f.pt");
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find(
                "f.pt: optimizer/optimizer/param_groups/1/params: " + std::to_string(decay.size() - 1) +
                " parameters, " + std::to_string(decay.size()) + " expected"),
            std::string::npos)
      << layout.status().message();
  layout = ReadOptimizerLayout(view, optimizer(Value::List({first, second, second})), "f.pt");
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("3 groups"), std::string::npos) << layout.status().message();
}

TEST(MegatronOptimizer, SettingsAndStepsRoundTripThroughTheManifest) {
  MegatronState state;
  state.iteration = 5;
  state.carried = Value::Dict();
  state.optimizer.groups.items().push_back(
      Value::Dict({{Value::Str("betas"), Value::Tuple({Value::Float(0.9), Value::Float(0.95)})}}));
  state.optimizer.steps.push_back(Step(3, {"a", "b"}));
  state.optimizer.steps.push_back({{"c"}, Value::Int(4), {}});
  nlohmann::json extra = {{"megatron", EncodeMegatronState(state)}};
  auto back = LoadMegatronState(extra, "m.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->optimizer.groups, state.optimizer.groups);
  ASSERT_EQ(back->optimizer.steps.size(), 2u);
  EXPECT_EQ(back->optimizer.steps[0].params, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back->optimizer.steps[0].value, state.optimizer.steps[0].value);
  EXPECT_EQ(back->optimizer.steps[0].tensors[0].bytes, state.optimizer.steps[0].tensors[0].bytes);
  EXPECT_EQ(back->optimizer.steps[1].value, Value::Int(4));
  extra["megatron"]["optimizer"]["steps"][1]["tensors"] = extra["megatron"]["optimizer"]["steps"][0]["tensors"];
  auto bad = LoadMegatronState(extra, "m.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("extra.megatron.optimizer.steps[1]: a tensor value needs its one storage"),
            std::string::npos)
      << bad.status().message();
}

TEST(MegatronOptimizer, TorchDistCommonCarriesGroupsStepAndScaler) {
  MegatronState state;
  state.iteration = 90;
  auto group = [](double lr, double wd_mult) {
    return Value::Dict({{Value::Str("lr"), Value::Float(lr)}, {Value::Str("wd_mult"), Value::Float(wd_mult)}});
  };
  state.optimizer.groups = Value::List({group(0.1, 1.0), group(0.2, 0.0)});
  state.optimizer.steps.push_back(Step(77, {"p1", "p2"}));
  pickle::Tensor scale;
  scale.storage_key = "c0";
  scale.dtype = DType::kF32;
  scale.storage_numel = 1;
  state.carried = Value::Dict(
      {{Value::Str("optimizer"),
        Value::Dict({{Value::Str("grad_scaler"), Value::Dict({{Value::Str("scale"), Value::FromTensor(scale)},
                                                              {Value::Str("growth_tracker"), Value::Int(3)}})}})}});
  state.tensors = {{"c0", DType::kF32, 1, "\x00\x00\x80\x47"}, {"c1", DType::kU8, 2, "zz"}};
  std::vector<CarriedTensor> storages;
  auto common = McoreOptimizerCommon(state, /*masters=*/true, &storages);
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  // Float16OptimizerWithFloat16Params' layout; the scaler's storage and the step's, not c1.
  const Value& inner = *common->Find("optimizer");
  EXPECT_EQ(*inner.Find("param_groups"), state.optimizer.groups);
  EXPECT_EQ(inner.Find("state")->Find("common_step")->tensor().storage_key, "s");
  ASSERT_NE(common->Find("grad_scaler"), nullptr);
  std::map<std::string, std::string> bytes;
  for (const CarriedTensor& c : storages) bytes[c.key] = c.bytes;
  EXPECT_EQ(bytes, (std::map<std::string, std::string>{{"c0", state.tensors[0].bytes},
                                                       {"s", state.optimizer.steps[0].tensors[0].bytes}}));
  auto read = [&](const pickle::Tensor& t) -> Result<std::string> { return bytes.at(t.storage_key); };
  // Read back (pickled, as common.pt holds it), the groups saved in the other order.
  Value saved = *pickle::Unpickle(pickle::Pickle(*common), "common.pt");
  pickle::Items& groups = saved.Find("optimizer")->Find("param_groups")->items();
  std::swap(groups[0], groups[1]);
  auto back = ReadMcoreOptimizerCommon(saved, {"p1", "p2", "p3"}, read, "common.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->meta.groups, state.optimizer.groups);
  ASSERT_EQ(back->meta.steps.size(), 1u);
  EXPECT_EQ(back->meta.steps[0].params, (std::vector<std::string>{"p1", "p2", "p3"}));
  EXPECT_EQ(back->meta.steps[0].tensors[0].bytes, state.optimizer.steps[0].tensors[0].bytes);
  ASSERT_EQ(back->tensors.size(), 1u);
  EXPECT_EQ(back->tensors[0].bytes, state.tensors[0].bytes);
  EXPECT_EQ(back->kept.Find("grad_scaler")->Find("scale")->tensor().storage_key, back->tensors[0].key);
  EXPECT_EQ(*back->kept.Find("grad_scaler")->Find("growth_tracker"), Value::Int(3));
  // A pickled dict may repeat a key: no 'params' stays in a group (found by mcore_common_fuzz).
  Value repeated = saved;
  for (Value& g : repeated.Find("optimizer")->Find("param_groups")->items()) {
    g.pairs().emplace_back(Value::Str("params"), Value::List());
    g.pairs().emplace_back(Value::Str("params"), Value::List());
  }
  back = ReadMcoreOptimizerCommon(repeated, {"p1"}, read, "common.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (const Value& g : back->meta.groups.items()) EXPECT_EQ(g.Find("params"), nullptr);
  // FP32Optimizer's layout; a save without common_step had step 0 (Megatron-Core leaves it out).
  common = McoreOptimizerCommon(state, /*masters=*/false, &storages);
  ASSERT_TRUE(common.ok());
  Value fp32 = *common;
  EXPECT_EQ(*fp32.Find("param_groups"), state.optimizer.groups);
  fp32.Find("state")->Erase("common_step");
  back = ReadMcoreOptimizerCommon(fp32, {"p1"}, read, "common.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->kept.is_none());
  EXPECT_EQ(back->meta.steps[0].tensors[0].bytes, std::string(4, '\0'));
  // Steps that differ cannot be one common step; bad entries are named.
  state.optimizer.steps.push_back(Step(78, {"p3"}));
  common = McoreOptimizerCommon(state, true, &storages);
  ASSERT_FALSE(common.ok());
  EXPECT_NE(common.status().message().find("the Adam step of p1 differs from that of p3"), std::string::npos)
      << common.status().message();
  fp32.Find("param_groups")->items().push_back(group(0.3, 0.0));
  fp32.Find("param_groups")->items().push_back(group(0.3, 0.0));
  back = ReadMcoreOptimizerCommon(fp32, {"p1"}, read, "common.pt");
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("common.pt: optimizer/param_groups: a list of one or two groups"),
            std::string::npos)
      << back.status().message();
  saved.Find("optimizer")->Find("state")->Set("common_step", Value::Str("7"));
  back = ReadMcoreOptimizerCommon(saved, {"p1"}, read, "common.pt");
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("common.pt: optimizer/optimizer/state/common_step: a str"), std::string::npos)
      << back.status().message();
}

}  // namespace
}  // namespace ptc::megatron
