#include "ptc/checkpoint/megatron/dp_reshardable_save.h"

#include <algorithm>
#include <set>
#include <utility>

namespace ptc::megatron {
namespace {

using pickle::Value;

Status Bad(const std::string& where, const std::string& what) { return InvalidArgumentError(where + ": " + what); }

std::string Abbreviated(const Value& v) { return Abbreviate(v.DebugString(), 200); }

// A domain's saved per_bucket_numel (`padded`) or per_bucket_numel_unpadded is the layout's.
Status CheckSizes(const DpDomain& d, bool padded, const Value& saved, const std::string& key,
                  const std::string& config) {
  const Value want = PerBucketNumel(d, padded);
  if (saved.DebugString() == want.DebugString()) return Status::OK();
  const std::string layout = " (" + config + ": one buffer of " + Abbreviated(d.dtypes) + ", one bucket)";
  // Of the layout's shape ([{dtypes: [n, ...]}]): the bucket at fault and both sizes.
  const Value* sizes = nullptr;
  if (saved.is_sequence() && saved.items().size() == 1 && saved.items()[0].is_dict() &&
      saved.items()[0].pairs().size() == 1 &&
      saved.items()[0].pairs()[0].first.DebugString() == d.dtypes.DebugString() &&
      saved.items()[0].pairs()[0].second.is_sequence()) {
    sizes = &saved.items()[0].pairs()[0].second;
  }
  const std::vector<Index>& layout_sizes = padded ? d.numel : d.numel_unpadded;
  for (size_t b = 0; sizes != nullptr && b < std::max(sizes->items().size(), layout_sizes.size()); ++b) {
    const std::string got = b < sizes->items().size() ? Abbreviated(sizes->items()[b]) + " elements" : "no bucket";
    const std::string wanted = b < layout_sizes.size() ? std::to_string(layout_sizes[b]) + " elements" : "none";
    if (got != wanted) {
      return Bad(key, "bucket_idx_" + std::to_string(b) + " has " + got + ", the layout gives it " + wanted + layout);
    }
  }
  return Bad(key, "is " + Abbreviated(saved) + ", the layout's is " + want.DebugString() + layout);
}

// The groups of a domain's optimizer object, and their step (null: none).
struct SavedGroups {
  Value groups;               // without 'step'
  std::optional<Value> step;  // the groups' one step
};

// \error InvalidArgument naming the key: no dict with a list of dict groups,
//        a step that is no number, groups whose steps differ.
Result<SavedGroups> GroupsOf(const Value& object, const std::string& key) {
  const Value* groups = object.is_dict() ? object.Find("param_groups") : nullptr;
  if (groups == nullptr || !groups->is_sequence() || groups->items().empty() ||
      !std::all_of(groups->items().begin(), groups->items().end(), [](const Value& g) { return g.is_dict(); })) {
    return Bad(key,
               "no dict with 'param_groups', a list of dict groups (DistributedOptimizer.state_dict()'s "
               "'optimizer')");
  }
  SavedGroups out{Value::List(), std::nullopt};
  for (size_t i = 0; i < groups->items().size(); ++i) {
    Value g = groups->items()[i];
    const Value* step = g.Find("step");
    const std::string where = "param_groups/" + std::to_string(i) + "/step";
    std::optional<Value> value;
    if (step != nullptr && !step->is_none()) {
      if (step->kind() != pickle::Kind::kInt && step->kind() != pickle::Kind::kFloat) {
        return Bad(key, where + " is a " + std::string(pickle::KindName(step->kind())) + ", not a number");
      }
      value = *step;
    }
    if (i > 0 &&
        (value.has_value() != out.step.has_value() || (value && value->DebugString() != out.step->DebugString()))) {
      return Bad(key, where + " " + (value ? value->DebugString() : "None") + " differs from param_groups/0's " +
                          (out.step ? out.step->DebugString() : "None") +
                          ": Megatron-Core's distributed optimizer keeps one step");
    }
    out.step = std::move(value);
    while (g.Erase("step")) {}
    out.groups.items().push_back(std::move(g));
  }
  return out;
}

double StepNumber(const Value& v) {
  return v.kind() == pickle::Kind::kInt ? static_cast<double>(v.as_int()) : v.as_float();
}

// The common part of one optimizer (FP32Optimizer's layout, which ReadMcoreOptimizerCommon reads).
Value CommonPart(const SavedGroups& g) {
  Value part = Value::Dict({{Value::Str("param_groups"), g.groups}});
  if (g.step) part.Set("state", Value::Dict({{Value::Str("common_step"), *g.step}}));
  return part;
}

}  // namespace

std::vector<LocalTensor> SavedBucketStates(const DpReshardableLayout& layout) {
  std::set<std::pair<std::string, Box>> seen;
  std::vector<LocalTensor> out = layout.tensors;
  for (LocalTensor& t : out) {
    std::erase_if(t.segments, [&](const Segment& s) { return !seen.emplace(s.tensor, s.box).second; });
  }
  return out;
}

std::vector<BucketRun> BucketRuns(const LocalTensor& bucket, Index begin, Index end) {
  std::vector<BucketRun> out;
  for (const Segment& s : bucket.segments) {
    // Each run contiguous both in the bucket and in the box's row-major order
    // (one run for a segment of whole rows of its parameter's shard).
    ForEachRun(s.box, s.box, s.layout, s.box, DenseLayout(s.box), [&](Index src, Index dst, Index count) {
      const Index lo = std::max(src, begin), hi = std::min(src + count, end);
      if (lo >= hi) return;
      Index at = lo;
      for (const Box& b : FlatRangeToBoxes(s.box.shape(), dst + (lo - src), dst + (hi - src))) {
        out.push_back({s.tensor, Translate(b, s.box.begin), at});
        at += b.volume();
      }
    });
  }
  std::sort(out.begin(), out.end(), [](const BucketRun& a, const BucketRun& b) { return a.at < b.at; });
  return out;
}

Result<Value> DpReshardableSavedCommon(const DpReshardableLayout& layout, const SavedObjectFn& object,
                                       const std::string& config, const std::string& what) {
  std::optional<SavedGroups> dense, experts;
  std::optional<std::pair<Value, std::string>> step;  // the first domain's, and its key
  for (const DpDomain& d : layout.domains) {
    for (const bool padded : {true, false}) {
      const std::string key = d.prefix + (padded ? "per_bucket_numel" : "per_bucket_numel_unpadded") + "/shard_0_1";
      PTC_ASSIGN_OR_RETURN(const std::optional<Value> sizes, object(key));
      if (sizes) PTC_RETURN_IF_ERROR(CheckSizes(d, padded, *sizes, what + ": " + key, config));
    }
    const std::string key = d.prefix + "optimizer/shard_0_1";
    PTC_ASSIGN_OR_RETURN(const std::optional<Value> saved, object(key));
    std::optional<SavedGroups>& first = d.experts ? experts : dense;
    if (!saved) {
      if (!first) return Bad(what + ": " + key, "is not among the files at hand (it holds the groups and the step)");
      continue;
    }
    PTC_ASSIGN_OR_RETURN(SavedGroups groups, GroupsOf(*saved, what + ": " + key));
    if (groups.step && step && StepNumber(*groups.step) != StepNumber(step->first)) {
      return Bad(what + ": " + key, "its groups' step " + groups.step->DebugString() + " differs from " +
                                        step->first.DebugString() + " of " + step->second +
                                        ": Megatron-Core's distributed optimizer keeps one step");
    }
    if (groups.step && !step) step.emplace(*groups.step, key);
    if (!first) first = std::move(groups);
  }
  if (!dense) return Bad(what, "the save has no dense domain of the distributed optimizer");
  if (!layout.chained) return CommonPart(*dense);
  if (!experts) return Bad(what, "the save has no expert-parallel domain of the distributed optimizer");
  return Value::Dict({{Value::Int(0), CommonPart(*dense)}, {Value::Int(1), CommonPart(*experts)}});
}

}  // namespace ptc::megatron
