// Megatron-Core's `*._extra_state` model entries (ptc/checkpoint/megatron/extra.h):
// kept per saved tp rank under global names, through the manifest, and rendered
// back into the model dict of every rank that holds their module, at their place,
// on the saved grid and on another.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ptc/checkpoint/megatron/extra.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using ::ptc::testing::LayoutView;

using pickle::Value;

const char kDims[] = "layers=4,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=16";

// io.BytesIO as torch.save pickles it (Transformer Engine's extra state), holding `text`.
Value BytesIO(const std::string& text) {
  pickle::Object o;
  o.callable = {"_io", "BytesIO"};
  o.build = pickle::Object::Build::kNewObj;
  o.state = pickle::Boxed<Value>(Value::Tuple({Value::Bytes(text), Value::Int(0), Value::None()}));
  return Value::FromObject(std::move(o));
}

// The extra-state keys of one layer of the local spec, and of the output layer.
std::vector<std::string> LayerKeys(int layer) {
  const std::string l = "decoder.layers." + std::to_string(layer) + ".";
  return {l + "self_attention.core_attention._extra_state", l + "self_attention.linear_proj._extra_state",
          l + "self_attention.linear_qkv._extra_state", l + "mlp.linear_fc1._extra_state",
          l + "mlp.linear_fc2._extra_state"};
}

// The state a tp=2, pp=2 save keeps: every rank's entries, each value naming the saved tp
// rank and the global key (one with a tensor, as older Transformer Engine saved).
MegatronState Saved(const ModelSpec& spec) {
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  MegatronState state;
  state.extra_tp = 2;
  for (int rank = 0; rank < config.world_size(); ++rank) {
    const RankView view = *LayoutView(spec, config, rank);
    std::vector<std::string> keys;
    for (int layer = 0; layer < 2; ++layer) {
      for (const std::string& k : LayerKeys(layer)) keys.push_back(k);
    }
    if (view.coords.pp == 1) keys.push_back("output_layer._extra_state");
    for (const std::string& local : keys) {
      const ExtraName name = GlobalExtraName(view, local);
      ExtraEntry e{
          view.coords.tp, name.key, name.anchor, BytesIO("tp" + std::to_string(view.coords.tp) + " " + name.key), {}};
      if (local == "output_layer._extra_state") {
        pickle::Tensor t;
        t.storage_key = "x";
        t.storage_key += std::to_string(state.extra.size());
        t.storage_key += "_0";
        t.dtype = DType::kU8;
        t.storage_numel = 3;
        t.shape = {3};
        t.stride = {1};
        e.value = Value::FromTensor(t);
        e.tensors.push_back({t.storage_key, DType::kU8, 3, "tp" + std::to_string(view.coords.tp)});
      }
      state.extra.push_back(std::move(e));
    }
  }
  return state;
}

TEST(MegatronExtra, NamesAreGlobalAndAnchoredByTheirModule) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16);
  const RankView last = *LayoutView(spec, *ParseConfig("tp=2,pp=2"), 3);  // tp 1, pp 1: layers 2, 3
  ExtraName n = GlobalExtraName(last, "decoder.layers.1.self_attention.linear_qkv._extra_state");
  EXPECT_EQ(n.key, "decoder.layers.3.self_attention.linear_qkv._extra_state");
  EXPECT_EQ(n.anchor.rfind("decoder.layers.3.self_attention.linear_qkv.", 0), 0u) << n.anchor;
  n = GlobalExtraName(last, "decoder.layers.0.self_attention.core_attention._extra_state");
  EXPECT_EQ(n.key, "decoder.layers.2.self_attention.core_attention._extra_state");
  n = GlobalExtraName(last, "output_layer._extra_state");
  EXPECT_EQ(n.key, "output_layer._extra_state");
  EXPECT_EQ(n.anchor, "output_layer.weight");
  EXPECT_TRUE(IsExtraStateKey("a.b._extra_state"));
  EXPECT_TRUE(IsExtraStateKey("_extra_state"));
  EXPECT_FALSE(IsExtraStateKey("a.b_extra_state"));
  EXPECT_FALSE(IsExtraStateKey("a.weight"));
}

TEST(MegatronExtra, RenderedIntoEveryRankOfTheSavedGridAndOfAnother) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16);
  // Through the manifest.
  auto state = LoadMegatronState({{"megatron", EncodeMegatronState(Saved(spec))}}, "m.json");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->extra.size(), Saved(spec).extra.size());
  for (const char* cfg : {"tp=2,pp=2", "tp=1,pp=1", "tp=2,pp=1", "tp=1,pp=4"}) {
    const ParallelConfig config = *ParseConfig(cfg);
    for (int rank = 0; rank < config.world_size(); ++rank) {
      SCOPED_TRACE(std::string(cfg) + " rank " + std::to_string(rank));
      auto computed = LayoutView(spec, config, rank);
      ASSERT_TRUE(computed.ok()) << computed.status().ToString();
      const RankView& view = *computed;
      auto built = BuildRankState(spec, config, view, *state);
      ASSERT_TRUE(built.ok()) << built.status().ToString();
      const Value& model = *built->root.Find("model");
      // Every layer the rank holds has its five entries, the value of saved tp rank tp mod 2.
      const int saved_tp = view.coords.tp % 2;
      std::map<std::string, std::string> want;  // local key -> global key
      const int layers = 4 / config.pp;
      for (int local = 0; local < layers; ++local) {
        const std::vector<std::string> l = LayerKeys(local), g = LayerKeys(view.coords.pp * layers + local);
        for (size_t k = 0; k < l.size(); ++k) want[l[k]] = g[k];
      }
      size_t extras = 0;
      for (const auto& [key, value] : model.pairs()) extras += IsExtraStateKey(key.as_str());
      const bool last = view.coords.pp == config.pp - 1;
      EXPECT_EQ(extras, want.size() + (last ? 1 : 0));
      for (const auto& [local, global] : want) {
        const Value* v = model.Find(local);
        ASSERT_NE(v, nullptr) << local;
        EXPECT_EQ(*v, BytesIO("tp" + std::to_string(saved_tp) + " " + global)) << local;
      }
      // At its place: right after its module's last parameter.
      std::vector<std::string> order;
      for (const auto& [key, value] : model.pairs()) order.push_back(key.as_str());
      const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.";
      for (size_t i = 0; i < order.size(); ++i) {
        if (order[i] == qkv + "_extra_state") {
          ASSERT_GT(i, 0u);
          EXPECT_EQ(order[i - 1].rfind(qkv, 0), 0u) << order[i - 1];
          EXPECT_TRUE(i + 1 == order.size() || order[i + 1].rfind(qkv, 0) != 0) << order[i + 1];
        }
      }
      // The tensor entry and its storage (after the carried ones).
      const Value* out = model.Find("output_layer._extra_state");
      ASSERT_EQ(out != nullptr, last);
      if (!last) continue;
      ASSERT_TRUE(out->is_tensor());
      bool found = false;
      for (const RankState::Storage& s : built->storages) {
        if (s.key == out->tensor().storage_key) {
          ASSERT_NE(s.carried, nullptr);
          EXPECT_EQ(s.carried->bytes, "tp" + std::to_string(saved_tp));
          found = true;
        }
      }
      EXPECT_TRUE(found) << out->tensor().storage_key;
    }
  }
}

TEST(MegatronExtra, MalformedRecordsNameTheField) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16);
  const nlohmann::json good = {{"megatron", EncodeMegatronState(Saved(spec))}};
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j["extra_state"]["tp"] = 0u; }, "extra.megatron.extra_state.tp: 0 is no tp size"},
      {[](nlohmann::json& j) { j["extra_state"]["entries"][3]["tp"] = 2u; },
       "extra.megatron.extra_state.entries[3]: expected {tp (below 2)"},
      {[](nlohmann::json& j) { j["extra_state"]["entries"][0]["value"] = "zz"; },
       "extra.megatron.extra_state.entries[0].value"},
      {[](nlohmann::json& j) { j["extra_state"] = 1; }, "extra.megatron.extra_state: expected {tp, entries}"},
  };
  for (const auto& [damage, needle] : cases) {
    nlohmann::json bad = good;
    damage(bad["megatron"]);
    auto r = LoadMegatronState(bad, "m.json");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace ptc::megatron
