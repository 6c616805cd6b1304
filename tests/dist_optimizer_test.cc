// The DistributedOptimizer's dp_reshardable form of a zero=1 layout
// (ptc/checkpoint/megatron/dist_optimizer.h): its keys, and where each
// parameter's state lies in its domain's bucket, against a placement written
// here from the local spec's registration order (TransformerLayer's modules,
// the embedding first and the output layer last) and the buffer's rules
// (reversed, 64-element starts, padding to lcm(dp, 128)); its objects; and
// the refusals. The real client's load of it is clients_test's
// MegatronCoreDistributedOptimizer... case.
#include "ptc/checkpoint/megatron/dist_optimizer.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dist_optimizer_util.h"
#include "ptc/model/box.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using pickle::Value;
using ::ptc::megatron::testing::LocalOrder;
using ::ptc::testing::FitLayout;
using ::ptc::testing::Spec;

constexpr const char* kDims = "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32";
constexpr const char* kBucket = "gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.";

TEST(DpReshardable, PlacesEveryParametersStateWhereTheBufferRulesSay) {
  const ModelSpec spec = Spec("llama", kDims, DType::kBF16, /*optimizer=*/true);
  const ModelLayout layout = FitLayout(spec, *ParseConfig("tp=2,pp=2,dp=2,zero=1"));
  MegatronState state;
  state.iteration = 7;
  Result<DpReshardable> dist = PlanDpReshardable(layout, NameSet::kLocal, state);
  ASSERT_TRUE(dist.ok()) << dist.status().ToString();
  ASSERT_EQ(dist->tensors.size(), 4u * 3);
  ASSERT_EQ(dist->objects.size(), 4u * 3);
  for (int pp = 0; pp < 2; ++pp) {
    for (int tp = 0; tp < 2; ++tp) {
      const std::string prefix = "optimizer.distributed.dp_group_idx_" + std::to_string(tp + 2 * pp) + ".";
      RankCoords k;
      k.tp = tp, k.pp = pp;
      const RankView view = *layout.View(layout.config().RankOf(k));
      std::map<std::string, const LocalTensor*> by_global;  // a parameter by its first segment's global tensor
      for (const LocalTensor& t : view.model) by_global[t.segments.front().tensor] = &t;
      // The reference placement: registration order reversed, each start a multiple of 64.
      std::map<std::string, Index> start;
      Index end = 0;
      const std::vector<std::string> order = LocalOrder(pp);
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        ASSERT_EQ(by_global.count(*it), 1u) << *it;
        start[*it] = (end + 63) / 64 * 64;
        end = start[*it] + NumElements(by_global.at(*it)->shape);
      }
      ASSERT_EQ(start.size(), view.model.size());
      for (int s = 0; s < 3; ++s) {
        const LocalTensor& bucket = dist->tensors[(tp + 2 * pp) * 3 + s];
        const char* kind[] = {"param", "exp_avg", "exp_avg_sq"};
        const char* suffix[] = {".fp32", ".exp_avg", ".exp_avg_sq"};
        EXPECT_EQ(bucket.name, prefix + kBucket + kind[s]);
        EXPECT_EQ(bucket.dtype, DType::kF32);
        EXPECT_EQ(bucket.shape, (Shape{end}));
        std::vector<Segment> want;
        for (const LocalTensor& t : view.model) {
          for (Segment seg : t.segments) {
            seg.layout.offset += start.at(t.segments.front().tensor);
            seg.tensor += suffix[s];
            want.push_back(seg);
          }
        }
        auto by_offset = [](const Segment& a, const Segment& b) { return a.layout.offset < b.layout.offset; };
        std::vector<Segment> got = bucket.segments;
        std::sort(want.begin(), want.end(), by_offset);
        std::sort(got.begin(), got.end(), by_offset);
        EXPECT_EQ(got, want) << bucket.name;
      }
      const Index padded = (end + 127) / 128 * 128;  // lcm(dp=2, 128)
      const Value dtypes = Value::Tuple({Value::FromGlobal({"torch", "bfloat16"}), Value::FromGlobal({"torch", "float32"})});
      const auto& objects = dist->objects;
      const size_t o = static_cast<size_t>(tp + 2 * pp) * 3;
      EXPECT_EQ(objects[o].first, prefix + "optimizer/shard_0_1");
      const Value& groups = *objects[o].second.Find("param_groups");
      ASSERT_EQ(groups.items().size(), 2u);
      for (const Value& g : groups.items()) EXPECT_EQ(g.Find("step")->DebugString(), Value::Float(7).DebugString());
      EXPECT_EQ(objects[o + 1].first, prefix + "per_bucket_numel/shard_0_1");
      EXPECT_EQ(objects[o + 1].second.DebugString(),
                Value::List({Value::Dict({{dtypes, Value::List({Value::Int(padded)})}})}).DebugString());
      EXPECT_EQ(objects[o + 2].first, prefix + "per_bucket_numel_unpadded/shard_0_1");
      EXPECT_EQ(objects[o + 2].second.DebugString(),
                Value::List({Value::Dict({{dtypes, Value::List({Value::Int(end)})}})}).DebugString());
    }
  }
  EXPECT_EQ(dist->common.DebugString(),
            Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str("dp_reshardable")}}).DebugString());
}

TEST(DpReshardable, ExpertsAtEpOneAreOrdinaryParametersOfTheOneBuffer) {
  MegatronState state;
  const ModelSpec moe = Spec("llama", std::string(kDims) + ",experts=4,moe_ffn=32", DType::kBF16, true);
  // At ep = 1 the experts are ordinary parameters of the one buffer, SequentialMLP's order.
  Result<DpReshardable> dist = PlanDpReshardable(FitLayout(moe, *ParseConfig("tp=1,dp=2,zero=1")), NameSet::kLocal, state);
  ASSERT_TRUE(dist.ok()) << dist.status().ToString();
  ASSERT_EQ(dist->tensors.size(), 3u);
  const std::string fc1 = "decoder.layers.3.mlp.experts.local_experts.3.linear_fc1.weight.exp_avg";
  const std::string fc2 = "decoder.layers.3.mlp.experts.local_experts.3.linear_fc2.weight.exp_avg";
  Index at1 = -1, at2 = -1;
  for (const Segment& s : dist->tensors[1].segments) {
    if (s.tensor == fc1) at1 = s.layout.offset;
    if (s.tensor == fc2) at2 = s.layout.offset;
  }
  // Reversed registration: the last expert's fc2 just before its fc1 (64 x 32 elements).
  EXPECT_EQ(at1, at2 + 64 * 32) << at1 << " " << at2;
}

TEST(DpReshardable, RefusesStepsThatDifferNamingTheRule) {
  MegatronState state;
  const ModelSpec dense = Spec("llama", kDims, DType::kBF16, true);
  state.optimizer.steps = {StepValue{{"output_layer.weight"}, Value::Float(3)},
                           StepValue{{"embedding.word_embeddings.weight"}, Value::Float(4)}};
  Result<DpReshardable> dist = PlanDpReshardable(FitLayout(dense, *ParseConfig("tp=1,dp=2,zero=1")), NameSet::kTe, state);
  ASSERT_FALSE(dist.ok());
  EXPECT_EQ(dist.status().message(),
            "the Adam step of output_layer.weight differs from that of embedding.word_embeddings.weight: "
            "Megatron-Core's distributed optimizer keeps one step for every parameter");
}

// At ep > 1: the ChainedOptimizer's two DistributedOptimizers. The sizes are megatron-core
// 0.16.1's own, measured (docs/megatron_format.md): mcore_moe.py's model at tp=1, dp=4, ep=2
// makes a dense bucket of 70464 elements and one of 24576 per ep rank.
TEST(DpReshardable, ExpertsAtEpTwoAreTheExpertParallelOptimizersBuckets) {
  const ModelSpec moe = Spec(
      "llama", "layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32",
      DType::kBF16, true);
  MegatronState state;
  Result<DpReshardable> dist =
      PlanDpReshardable(FitLayout(moe, *ParseConfig("tp=1,dp=4,ep=2,zero=1")), NameSet::kLocal, state);
  ASSERT_TRUE(dist.ok()) << dist.status().ToString();
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::set<std::string>> experts_of;  // key -> the experts its segments hold
  for (const LocalTensor& t : dist->tensors) {
    shapes[t.name] = t.shape;
    for (const Segment& s : t.segments) {
      const size_t at = s.tensor.find("local_experts.");
      if (at != std::string::npos) experts_of[t.name].insert(s.tensor.substr(at + 14, 1));
    }
  }
  const std::string dtypes = "gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.";
  const std::string dense = std::string("chained_0.optimizer.distributed.dp_group_idx_0.") + dtypes;
  const std::string e0 = std::string("chained_1.optimizer.distributed.dp_group_idx_0.") + dtypes;
  const std::string e1 = std::string("chained_1.optimizer.distributed.dp_group_idx_1.") + dtypes;
  ASSERT_EQ(shapes.size(), 9u);
  EXPECT_EQ(shapes[dense + "param"], (Shape{70464}));
  EXPECT_EQ(shapes[e0 + "exp_avg"], (Shape{24576}));
  EXPECT_EQ(shapes[e1 + "exp_avg_sq"], (Shape{24576}));
  EXPECT_TRUE(experts_of[dense + "param"].empty());
  EXPECT_EQ(experts_of[e0 + "param"], (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(experts_of[e1 + "param"], (std::set<std::string>{"2", "3"}));
  const Value common = Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str("dp_reshardable")}});
  EXPECT_EQ(dist->common.DebugString(),
            Value::Dict({{Value::Int(0), common}, {Value::Int(1), common}}).DebugString());
  for (const auto& [key, value] : dist->objects) {
    if (!key.ends_with("optimizer/shard_0_1")) continue;
    const pickle::Items& groups = value.Find("param_groups")->items();
    const bool expert = key.starts_with("chained_1.");
    ASSERT_EQ(groups.size(), expert ? 1u : 2u) << key;  // llama's experts: 2-D weights, weight decay
    for (const Value& g : groups) EXPECT_EQ(g.Find("is_expert_parallel")->DebugString(), Value::Bool(expert).DebugString());
  }
}

TEST(DpReshardable, ASaveIsTakenInTheDpReshardableFormOnlyAndRefusedNamingAnyOther) {
  const Value form = Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str("fully_reshardable")}});
  Result<bool> s = DpReshardableSave(form, "iter_0000300/common.pt");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("iter_0000300/common.pt: optimizer/param_state_sharding_type "
                                       "'fully_reshardable': a save of Megatron-Core's distributed optimizer in a "
                                       "form ptcfs does not take",
                                       0),
            0u)
      << s.status().message();
  const Value dp = Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str("dp_reshardable")}});
  s = DpReshardableSave(Value::Dict({{Value::Int(0), dp}, {Value::Int(1), form}}), "c.pt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("c.pt: optimizer/1/param_state_sharding_type"), std::string::npos);
  s = DpReshardableSave(Value::Dict({{Value::Int(0), dp}, {Value::Int(1), Value::Dict()}}), "c.pt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("c.pt: optimizer/1 has no param_state_sharding_type"), std::string::npos);
  EXPECT_TRUE(*DpReshardableSave(dp, "c.pt"));
  EXPECT_TRUE(*DpReshardableSave(DpReshardableCommon(/*chained=*/true), "c.pt"));
  const Value plain = Value::Dict({{Value::Str("optimizer"), Value::Dict({{Value::Str("param_groups"), Value::List()}})}});
  EXPECT_FALSE(*DpReshardableSave(plain, "c.pt"));
}

}  // namespace
}  // namespace ptc::megatron
