// Taking a save of the DistributedOptimizer's dp_reshardable form
// (ptc/checkpoint/megatron/dp_reshardable_save.h, ptc/checkpoint/dcp/dist_optimizer_read.h):
// the bucket states back into the parameters' boxes, against a placement this
// file makes element by element from the buffer's rules (the local spec's
// registration order reversed, 64-element starts) and each parameter's local
// shard; the objects checked against the layout; a malformed save refused
// naming its key. The real client's save through a mount is clients_test's
// MegatronCoreDistributedOptimizer... cases.
#include "ptc/checkpoint/megatron/dp_reshardable_save.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dist_optimizer_util.h"
#include "ptc/checkpoint/dcp/dist_optimizer_read.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using pickle::Value;
using ::ptc::megatron::testing::LocalOrder;
using ::ptc::testing::FitLayout;
using ::ptc::testing::Spec;

constexpr const char* kDims = "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32";

// An element of a global tensor: (name, flat index).
using Element = std::pair<std::string, Index>;

Index Flat(const Shape& shape, const std::vector<Index>& x) {
  Index at = 0;
  for (size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + x[d];
  return at;
}

// Calls fn(coordinates) for each element of `box`, row-major.
template <typename Fn>
void ForEachElement(const Box& box, Fn&& fn) {
  if (box.empty()) return;
  std::vector<Index> x = box.begin;
  for (;;) {
    fn(x);
    size_t d = x.size();
    while (d-- > 0) {
      if (++x[d] < box.end[d]) break;
      x[d] = box.begin[d];
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

TEST(DpReshardableSave, EveryBucketElementGoesWhereThePlacementPutsIt) {
  const ModelSpec spec = Spec("llama", kDims, DType::kBF16, /*optimizer=*/true);
  const ModelLayout layout = FitLayout(spec, *ParseConfig("tp=2,pp=2,dp=3,zero=1"));
  std::map<std::string, Shape> shapes;
  const std::vector<GlobalTensor> globals = *GlobalTensors(spec);
  for (const GlobalTensor& g : globals) shapes[g.name] = g.shape;
  Result<DpReshardableLayout> form = LayOutDpReshardable(layout, NameSet::kLocal);
  ASSERT_TRUE(form.ok()) << form.status().ToString();
  ASSERT_EQ(form->domains.size(), 4u);
  ASSERT_EQ(form->tensors.size(), 4u * 3);
  const std::vector<LocalTensor> saved = SavedBucketStates(*form);
  std::map<std::string, std::vector<int>> held;  // per global state tensor, how often each element is read
  for (const auto& [name, shape] : shapes) held[name].assign(static_cast<size_t>(NumElements(shape)), 0);
  for (int pp = 0; pp < 2; ++pp) {
    for (int tp = 0; tp < 2; ++tp) {
      RankCoords k;
      k.tp = tp, k.pp = pp;
      const RankView view = *layout.View(layout.config().RankOf(k));
      std::map<std::string, const LocalTensor*> by_global;  // a parameter by its first segment's global tensor
      for (const LocalTensor& t : view.model) by_global[t.segments.front().tensor] = &t;
      const std::vector<std::string> order = LocalOrder(pp);
      for (int s = 0; s < 3; ++s) {
        const char* suffix[] = {".fp32", ".exp_avg", ".exp_avg_sq"};
        // The reference: registration order reversed, each start a multiple of 64, each
        // parameter's local shard row-major from there (its segments' layouts).
        std::map<Index, Element> at;
        Index end = 0;
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
          const LocalTensor& p = *by_global.at(*it);
          const Index start = (end + 63) / 64 * 64;
          for (const Segment& seg : p.segments) {
            ForEachElement(seg.box, [&](const std::vector<Index>& x) {
              Index address = seg.layout.offset;
              for (size_t d = 0; d < x.size(); ++d) address += (x[d] - seg.box.begin[d]) * seg.layout.strides[d];
              at[start + address] = {seg.tensor + suffix[s], Flat(shapes.at(seg.tensor), x)};
            });
          }
          end = start + NumElements(p.shape);
        }
        const LocalTensor& bucket = saved[static_cast<size_t>((tp + 2 * pp) * 3 + s)];
        ASSERT_EQ(bucket.shape, (Shape{end})) << bucket.name;
        // Read in runs cut anywhere (dp cuts fall inside parameters and rows).
        for (Index begin = 0; begin < end; begin += 997) {
          const Index stop = std::min(end, begin + 997);
          for (const BucketRun& run : BucketRuns(bucket, begin, stop)) {
            ASSERT_GE(run.at, begin);
            ASSERT_LE(run.at + run.box.volume(), stop);
            Index i = run.at;
            ForEachElement(run.box, [&](const std::vector<Index>& x) {
              const Element want = at.count(i) ? at.at(i) : Element{"a gap", i};
              const Element got{run.tensor, Flat(shapes.at(run.tensor), x)};
              EXPECT_EQ(got, want) << bucket.name << " at " << i;
              ++held[got.first][static_cast<size_t>(got.second)];
              ++i;
            });
          }
        }
      }
    }
  }
  // Each state element read once: a replicated norm from the first tp domain only.
  for (const auto& [name, counts] : held) {
    const bool state = name.ends_with(".fp32") || name.ends_with(".exp_avg") || name.ends_with(".exp_avg_sq");
    for (size_t i = 0; i < counts.size(); ++i) {
      ASSERT_EQ(counts[i], state ? 1 : 0) << name << " element " << i;
    }
  }
}

// The objects PlanDpReshardable renders, as a save's.
std::map<std::string, Value> Objects(const DpReshardable& form) {
  std::map<std::string, Value> out;
  for (const auto& [key, value] : form.objects) out[key] = value;
  return out;
}

SavedObjectFn From(const std::map<std::string, Value>& objects) {
  return [&objects](const std::string& key) -> Result<std::optional<Value>> {
    auto it = objects.find(key);
    if (it == objects.end()) return InvalidArgumentError("key " + key + ": missing");
    return std::optional<Value>(it->second);
  };
}

TEST(DpReshardableSave, TheObjectsGiveTheGroupsAndTheStepAndAreCheckedAgainstTheLayout) {
  const ModelSpec spec = Spec("llama", kDims, DType::kBF16, true);
  const ModelLayout layout = FitLayout(spec, *ParseConfig("tp=2,dp=2,zero=1"));
  MegatronState state;
  state.iteration = 9;
  state.optimizer.steps = {StepValue{{"output_layer.weight"}, Value::Float(1234)}};
  const DpReshardableLayout form = *LayOutDpReshardable(layout, NameSet::kTe);
  std::map<std::string, Value> objects = Objects(*PlanDpReshardable(layout, NameSet::kTe, state));
  Result<Value> common = DpReshardableSavedCommon(form, From(objects), "config tp=2,dp=2", "iter/.metadata");
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  ASSERT_EQ(common->Find("state")->Find("common_step")->DebugString(), Value::Float(1234).DebugString());
  const pickle::Items& groups = common->Find("param_groups")->items();
  ASSERT_EQ(groups.size(), 2u);
  for (const Value& g : groups) EXPECT_EQ(g.Find("step"), nullptr);
  EXPECT_EQ(groups[1].Find("wd_mult")->DebugString(), Value::Float(0).DebugString());

  const std::string numel = "optimizer.distributed.dp_group_idx_1.per_bucket_numel/shard_0_1";
  const Index padded = form.domains[1].numel[0];
  std::map<std::string, Value> bad = objects;
  bad[numel] = Value::List({Value::Dict({{form.domains[1].dtypes, Value::List({Value::Int(padded + 128)})}})});
  common = DpReshardableSavedCommon(form, From(bad), "config tp=2,dp=2", "iter/.metadata");
  ASSERT_FALSE(common.ok());
  EXPECT_EQ(common.status().message().rfind("iter/.metadata: " + numel + ": bucket_idx_0 has " +
                                                std::to_string(padded + 128) + " elements, the layout gives it " +
                                                std::to_string(padded) + " elements (config tp=2,dp=2",
                                            0),
            0u)
      << common.status().message();

  bad = objects;  // a second bucket
  bad[numel] =
      Value::List({Value::Dict({{form.domains[1].dtypes, Value::List({Value::Int(padded), Value::Int(256)})}})});
  common = DpReshardableSavedCommon(form, From(bad), "config tp=2,dp=2", "iter/.metadata");
  ASSERT_FALSE(common.ok());
  EXPECT_NE(common.status().message().find("bucket_idx_1 has 256 elements, the layout gives it none"),
            std::string::npos)
      << common.status().message();

  bad = objects;  // domain 1's step not the others'
  const std::string opt = "optimizer.distributed.dp_group_idx_1.optimizer/shard_0_1";
  Value groups7 = *bad[opt].Find("param_groups");
  for (Value& g : groups7.items()) g.Set("step", Value::Float(7));
  bad[opt].Set("param_groups", std::move(groups7));
  common = DpReshardableSavedCommon(form, From(bad), "config tp=2,dp=2", "iter/.metadata");
  ASSERT_FALSE(common.ok());
  EXPECT_NE(common.status().message().find(opt + ": its groups' step 7.0 differs from 1234.0"), std::string::npos)
      << common.status().message();

  bad = objects;
  bad.erase("optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1");
  common = DpReshardableSavedCommon(form, From(bad), "config tp=2,dp=2", "iter/.metadata");
  ASSERT_FALSE(common.ok());
  EXPECT_NE(common.status().message().find("dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1: missing"),
            std::string::npos);

  // An object on another worker is passed over, but for the first domain's groups.
  SavedObjectFn elsewhere = [&](const std::string& key) -> Result<std::optional<Value>> {
    if (key.find("dp_group_idx_0.") != std::string::npos) return std::optional<Value>();
    return std::optional<Value>(objects.at(key));
  };
  common = DpReshardableSavedCommon(form, elsewhere, "config tp=2,dp=2", "iter/.metadata");
  ASSERT_FALSE(common.ok());
  EXPECT_NE(common.status().message().find("dp_group_idx_0.optimizer/shard_0_1: is not among the files at hand"),
            std::string::npos);
}

TEST(DpReshardableSave, AChainedSaveGivesBothOptimizersParts) {
  const ModelSpec moe =
      Spec("llama", "layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4,moe_ffn=32,shared_ffn=32",
           DType::kBF16, true);
  const ModelLayout layout = FitLayout(moe, *ParseConfig("tp=1,dp=4,ep=2,zero=1"));
  MegatronState state;
  state.iteration = 3;
  const DpReshardableLayout form = *LayOutDpReshardable(layout, NameSet::kLocal);
  ASSERT_TRUE(form.chained);
  const std::map<std::string, Value> objects = Objects(*PlanDpReshardable(layout, NameSet::kLocal, state));
  Result<Value> common = DpReshardableSavedCommon(form, From(objects), "config", "m");
  ASSERT_TRUE(common.ok()) << common.status().ToString();
  ASSERT_NE(common->Find(Value::Int(0)), nullptr);
  const Value* experts = common->Find(Value::Int(1));
  ASSERT_NE(experts, nullptr);
  ASSERT_EQ(experts->Find("param_groups")->items().size(), 1u);
  EXPECT_EQ(experts->Find("param_groups")->items()[0].Find("is_expert_parallel")->DebugString(),
            Value::Bool(true).DebugString());
  EXPECT_EQ(experts->Find("state")->Find("common_step")->DebugString(), Value::Float(3).DebugString());
}

}  // namespace
}  // namespace ptc::megatron

namespace ptc::dcp {
namespace {

using ::ptc::testing::FitLayout;
using ::ptc::testing::Spec;

// A save's bucket keys as megatron-core writes them: each cut in `cut`-element chunks.
std::vector<SavedTensor> SavedBuckets(const megatron::DpReshardableLayout& form, Index cut) {
  std::vector<SavedTensor> out;
  for (const LocalTensor& t : form.tensors) {
    SavedTensor s{t.name, DType::kF32, t.shape, {}};
    for (Index at = 0; at < t.shape[0]; at += cut) {
      s.chunks.push_back(SavedChunk{Box{{at}, {std::min(t.shape[0], at + cut)}}, "__0_1.distcp", 0, 0});
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Each chunk's bytes at 4 times its first element (a file of the bucket's floats).
Result<std::optional<std::pair<size_t, uint64_t>>> AtItsPlace(const SavedTensor&, const SavedChunk& c) {
  return std::optional(std::make_pair(size_t{0}, static_cast<uint64_t>(c.box.begin[0]) * 4));
}

TEST(DpReshardableSave, AMalformedSaveIsRefusedNamingTheKey) {
  const ModelSpec spec = Spec("llama", "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32", DType::kBF16, true);
  const ModelLayout layout = FitLayout(spec, *ParseConfig("tp=1,dp=2,zero=1"));
  const megatron::DpReshardableLayout form = *megatron::LayOutDpReshardable(layout, megatron::NameSet::kLocal);
  const std::vector<SavedTensor> good = SavedBuckets(form, 1000);
  const std::string key = form.tensors[1].name;  // exp_avg
  auto take = [&](const std::vector<SavedTensor>& buckets) {
    DcpSource source{layout, {}, {}, {}, {}};
    Status s = AddBucketChunks(buckets, form, "config tp=1,dp=2", AtItsPlace, "iter/.metadata", &source);
    return std::make_pair(s, std::move(source.chunks));
  };
  auto [ok, chunks] = take(good);
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  Index elements = 0;
  for (const DcpSource::Chunk& c : chunks) {
    ASSERT_EQ(c.size, static_cast<uint64_t>(c.box.volume()) * 4);
    ASSERT_EQ(c.offset % 4, 0u);
    elements += c.box.volume();
  }
  Index want = 0;  // every parameter's three states, once
  const std::vector<GlobalTensor> globals = *GlobalTensors(spec);
  for (const GlobalTensor& g : globals) {
    if (g.name.ends_with(".fp32") || g.name.ends_with(".exp_avg") || g.name.ends_with(".exp_avg_sq")) {
      want += NumElements(g.shape);
    }
  }
  EXPECT_EQ(elements, want);

  std::vector<SavedTensor> bad = good;  // a missing key
  bad.erase(bad.begin() + 1);
  EXPECT_EQ(take(bad).first.message(), "iter/.metadata: key " + key +
                                           ": missing (a bucket state of the distributed optimizer's "
                                           "dp_reshardable form in config tp=1,dp=2)");
  bad = good;  // a chunk gap
  bad[1].chunks.erase(bad[1].chunks.begin() + 2);
  EXPECT_EQ(take(bad).first.message(), "iter/.metadata: key " + key + ": elements [2000, 3000) are in no chunk");
  bad = good;  // the wrong size
  bad[1].shape = {form.tensors[1].shape[0] + 64};
  EXPECT_NE(take(bad).first.message().find("key " + key + " is F32 [" + std::to_string(bad[1].shape[0]) +
                                           "], the layout's bucket (config tp=1,dp=2) is float32 ["),
            std::string::npos)
      << take(bad).first.message();
  bad = good;  // several buckets
  bad.push_back(bad[0]);
  const std::string second = form.domains[0].gbuf + "bucket_idx_1.param";
  bad.back().key = second;
  EXPECT_NE(take(bad).first.message().find("key " + second + ": a bucket past the first: several buckets"),
            std::string::npos)
      << take(bad).first.message();
}

}  // namespace
}  // namespace ptc::dcp
