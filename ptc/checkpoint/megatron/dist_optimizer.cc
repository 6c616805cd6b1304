#include "ptc/checkpoint/megatron/dist_optimizer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "ptc/checkpoint/megatron/ddp_buffer.h"
#include "ptc/checkpoint/megatron/optimizer.h"

namespace ptc::megatron {
namespace {

using pickle::Value;

// The state of the bucket keys, in DistributedOptimizer's names, and the global tensor suffix of each.
constexpr std::pair<const char*, const char*> kStates[] = {
    {"param", ".fp32"}, {"exp_avg", ".exp_avg"}, {"exp_avg_sq", ".exp_avg_sq"}};

// torch's name of a dtype ("bfloat16"); empty for one a parameter cannot have here.
std::string_view TorchName(DType t) {
  switch (t) {
    case DType::kF64: return "float64";
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    default: return "";
  }
}

Value TorchDType(DType t) { return Value::FromGlobal(pickle::Global{"torch", std::string(TorchName(t))}); }

// The common step as DistributedOptimizer.state_dict() writes it into each group: a number.
// \error FailedPrecondition when parameters' steps differ.
Result<Value> CommonStep(const MegatronState& state) {
  const OptimizerMeta& meta = state.optimizer;
  if (meta.steps.size() > 1) {
    return FailedPreconditionError("the Adam step of " + meta.steps[0].params.at(0) + " differs from that of " +
                                   meta.steps[1].params.at(0) +
                                   ": Megatron-Core's distributed optimizer keeps one step for every parameter");
  }
  if (meta.steps.empty()) return Value::Float(static_cast<double>(state.iteration));
  const StepValue& s = meta.steps[0];
  if (!s.value.is_tensor()) return s.value;
  const CarriedTensor& t = s.tensors.at(0);
  if (t.dtype == DType::kF32 && t.bytes.size() == 4) {
    float f;
    std::memcpy(&f, t.bytes.data(), 4);
    return Value::Float(f);
  }
  if (t.dtype == DType::kF64 && t.bytes.size() == 8) {
    double d;
    std::memcpy(&d, t.bytes.data(), 8);
    return Value::Float(d);
  }
  return FailedPreconditionError("the Adam step of " + s.params.at(0) + " is a " + std::string(DTypeName(t.dtype)) +
                                 " tensor of " + std::to_string(t.numel) +
                                 " elements: the distributed optimizer's groups take one number");
}

// The parameters of `rank` in the registration order of `names`: its routed
// experts' (`experts`) or the others, checked.
// \error FailedPrecondition as PlanDpReshardable's.
Result<std::vector<LocalTensor>> DomainParams(const ModelLayout& layout, NameSet names, int rank, bool experts) {
  PTC_ASSIGN_OR_RETURN(const RankView view, layout.View(rank));
  std::vector<std::string> te_order;
  for (const LocalTensor& t : view.model) te_order.push_back(t.name);
  std::vector<LocalTensor> params;
  for (size_t i : RegistrationOrder(names, te_order)) {
    if (!HasOptimizerState(view.model[i])) continue;  // a buffer: in no DDP buffer
    // At ep = 1 a routed expert is an ordinary parameter (Megatron-Core's param.allreduce is
    // False only with expert parallelism); at ep > 1 it is in the expert-parallel buffers.
    const bool expert = layout.config().ep > 1 && IsExpertParameter(view.model[i]);
    if (expert == experts) params.push_back(view.model[i]);
  }
  for (const LocalTensor& p : params) {
    if (p.dtype != params.front().dtype || TorchName(p.dtype).empty()) {
      return FailedPreconditionError(p.name + ": dtype " + std::string(DTypeName(p.dtype)) + " beside " +
                                     std::string(DTypeName(params.front().dtype)) +
                                     ": the distributed optimizer's torch_dist form is rendered for one buffer of "
                                     "float64, float32, float16 or bfloat16 parameters");
    }
  }
  return params;
}

// Bucket `b` of `buffer` as the state `suffix` (".fp32", ...) of `params`: their
// segments moved to their places in the bucket, the gaps covered by none.
LocalTensor BucketState(const std::string& key, const DdpBuffer& buffer, size_t b,
                        const std::vector<LocalTensor>& params, const char* suffix) {
  const DdpBucket& bucket = buffer.buckets[b];
  LocalTensor out{key, DType::kF32, Shape{bucket.numel_unpadded}, {}};
  for (const DdpSlot& slot : buffer.slots) {
    if (slot.bucket != static_cast<int>(b)) continue;
    for (const Segment& s : params[slot.param].segments) {
      Segment moved = s;
      moved.tensor += suffix;
      moved.layout.offset += slot.start - bucket.offset;
      out.segments.push_back(std::move(moved));
    }
  }
  return out;
}

// Megatron-core refuses a bucket a dp rank holds no parameter of ("empty bucket encountered").
Status CheckEveryRankHoldsAParameter(const DdpBuffer& buffer, int dp, const std::string& prefix) {
  for (size_t b = 0; b < buffer.buckets.size(); ++b) {
    for (int r = 0; r < dp; ++r) {
      const std::vector<DdpPiece> pieces = DdpRankPieces(buffer, b, r, dp);
      if (std::none_of(pieces.begin(), pieces.end(), [](const DdpPiece& p) { return p.param != kDdpPadding; })) {
        return FailedPreconditionError(prefix + "bucket_idx_" + std::to_string(b) + ": dp rank " + std::to_string(r) +
                                       " of " + std::to_string(dp) + " would hold only padding of its " +
                                       std::to_string(buffer.buckets[b].numel_unpadded) +
                                       " elements, which megatron-core 0.16.1 cannot save or load "
                                       "(\"empty bucket encountered\")");
      }
    }
  }
  return Status::OK();
}

// One optimizer's domain: its keys' prefix, parameters (registration order),
// data-parallel group and whether it is the experts'.
struct DomainSpec {
  std::string prefix;
  std::vector<LocalTensor> params;
  int dp = 1;
  bool experts = false;
};

// Its bucket states into `out`, and its sizes.
// \error FailedPrecondition as CheckEveryRankHoldsAParameter; InvalidArgument as LayOutDdpBuffer.
Status AddDomain(const DomainSpec& d, DpReshardableLayout* out) {
  std::vector<DdpParam> sizes;
  for (const LocalTensor& p : d.params) sizes.push_back({NumElements(p.shape)});
  PTC_ASSIGN_OR_RETURN(const DdpBuffer buffer, LayOutDdpBuffer(sizes, {d.dp}));
  const DType param = d.params.front().dtype;
  const DType grad = param == DType::kF16 ? DType::kF16 : DType::kF32;
  DpDomain domain;
  domain.prefix = d.prefix;
  domain.gbuf = d.prefix + "gbuf_idx_0.dtype_(torch." + std::string(TorchName(param)) + ", torch." +
                std::string(TorchName(grad)) + ").";
  domain.experts = d.experts;
  PTC_RETURN_IF_ERROR(CheckEveryRankHoldsAParameter(buffer, d.dp, domain.gbuf));
  std::set<size_t> groups;  // the experts' optimizer has the groups of its parameters, the dense one both
  for (const LocalTensor& p : d.params) groups.insert(WithoutWeightDecay(p) ? 1 : 0);
  domain.groups = d.experts ? std::vector<size_t>(groups.begin(), groups.end()) : std::vector<size_t>{0, 1};
  domain.dtypes = Value::Tuple({TorchDType(param), TorchDType(grad)});
  for (size_t b = 0; b < buffer.buckets.size(); ++b) {
    domain.numel.push_back(buffer.buckets[b].numel);
    domain.numel_unpadded.push_back(buffer.buckets[b].numel_unpadded);
    for (const auto& [name, suffix] : kStates) {
      out->tensors.push_back(
          BucketState(domain.gbuf + "bucket_idx_" + std::to_string(b) + "." + name, buffer, b, d.params, suffix));
    }
  }
  out->domains.push_back(std::move(domain));
  return Status::OK();
}

// Megatron's groups `gs` (0: with weight decay, 1: without) as rendered, each with `step`.
Value Groups(const OptimizerMeta& meta, const std::vector<size_t>& gs, bool experts, const Value& step) {
  Value groups = Value::List();
  for (size_t g : gs) {
    Value settings = experts ? RenderedExpertSettings(meta, g) : RenderedSettings(meta, g);
    settings.Set("step", step);
    groups.items().push_back(std::move(settings));
  }
  return groups;
}

// The expert-parallel domains at ep > 1: per (pp, ep, etp) the experts of its
// edp rank 0, G = etp_rank + etp * (ep_rank + ep * pp_rank).
Status AddExpertDomains(const ModelLayout& layout, NameSet names, DpReshardableLayout* out) {
  const ParallelConfig& c = layout.config();
  std::map<int, int> rank_of;  // G -> a rank of edp 0 holding it
  for (int rank = 0; rank < c.world_size(); ++rank) {
    const RankCoords k = c.CoordsOf(rank);
    if (k.edp == 0) rank_of.try_emplace(k.etp + c.expert_tp() * (k.ep + c.ep * k.pp), rank);
  }
  for (const auto& [g, rank] : rank_of) {
    PTC_ASSIGN_OR_RETURN(std::vector<LocalTensor> params, DomainParams(layout, names, rank, /*experts=*/true));
    if (params.empty()) continue;  // a stage without MoE layers: an expert optimizer without state
    PTC_RETURN_IF_ERROR(AddDomain({"chained_1.optimizer.distributed.dp_group_idx_" + std::to_string(g) + ".",
                                   std::move(params), c.expert_dp(), /*experts=*/true},
                                  out));
  }
  return Status::OK();
}

}  // namespace

Result<DpReshardableLayout> LayOutDpReshardable(const ModelLayout& layout, NameSet names) {
  const ParallelConfig& config = layout.config();
  for (const TensorRule& rule : layout.spec().schema.rules) {
    if (!rule.tied_to.empty() && config.pp > 1) {
      return FailedPreconditionError("rule '" + rule.name + "' is tied to '" + rule.tied_to +
                                     "' across pipeline stages: Megatron's shared-embedding buckets of the "
                                     "distributed optimizer are not rendered or taken yet");
    }
  }
  // A model with routed experts at ep > 1: Megatron-Core's ChainedOptimizer of the dense and the
  // expert-parallel DistributedOptimizer, each key prefixed with its index.
  DpReshardableLayout out;
  out.chained = layout.spec().dims.experts > 0 && config.ep > 1;
  for (int pp = 0; pp < config.pp; ++pp) {
    for (int tp = 0; tp < config.tp; ++tp) {
      RankCoords k;
      k.tp = tp, k.pp = pp;
      PTC_ASSIGN_OR_RETURN(std::vector<LocalTensor> params,
                           DomainParams(layout, names, config.RankOf(k), /*experts=*/false));
      PTC_RETURN_IF_ERROR(
          AddDomain({std::string(out.chained ? "chained_0." : "") + "optimizer.distributed.dp_group_idx_" +
                         std::to_string(tp + config.tp * pp) + ".",
                     std::move(params), config.dense_zero_ranks(), /*experts=*/false},
                    &out));
    }
  }
  if (out.chained) PTC_RETURN_IF_ERROR(AddExpertDomains(layout, names, &out));
  return out;
}

Value PerBucketNumel(const DpDomain& domain, bool padded) {
  Value sizes = Value::List();
  for (Index n : padded ? domain.numel : domain.numel_unpadded) sizes.items().push_back(Value::Int(n));
  return Value::List({Value::Dict({{domain.dtypes, std::move(sizes)}})});
}

Value DpReshardableCommon(bool chained) {
  const Value common = Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str(kDpReshardable)}});
  return chained ? Value::Dict({{Value::Int(0), common}, {Value::Int(1), common}}) : common;
}

Result<DpReshardable> PlanDpReshardable(const ModelLayout& layout, NameSet names, const MegatronState& state) {
  PTC_ASSIGN_OR_RETURN(DpReshardableLayout form, LayOutDpReshardable(layout, names));
  PTC_ASSIGN_OR_RETURN(const Value step, CommonStep(state));
  DpReshardable out;
  out.tensors = std::move(form.tensors);
  for (const DpDomain& d : form.domains) {
    out.objects.emplace_back(
        d.prefix + "optimizer/shard_0_1",
        Value::Dict({{Value::Str("param_groups"), Groups(state.optimizer, d.groups, d.experts, step)}}));
    out.objects.emplace_back(d.prefix + "per_bucket_numel/shard_0_1", PerBucketNumel(d, true));
    out.objects.emplace_back(d.prefix + "per_bucket_numel_unpadded/shard_0_1", PerBucketNumel(d, false));
  }
  out.common = DpReshardableCommon(form.chained);
  return out;
}

Result<bool> DpReshardableSave(const Value& optimizer, const std::string& what) {
  if (!optimizer.is_dict()) return false;
  std::vector<std::pair<std::string, const Value*>> parts = {{"optimizer", &optimizer}};
  for (const auto& [k, v] : optimizer.pairs()) {
    if (k.kind() == pickle::Kind::kInt && v.is_dict()) parts.emplace_back("optimizer/" + std::to_string(k.as_int()), &v);
  }
  std::string without;  // a ChainedOptimizer's part without a form
  bool any = false;
  for (const auto& [where, part] : parts) {
    const Value* type = part->Find("param_state_sharding_type");
    if (type == nullptr) {
      if (where != "optimizer" && without.empty()) without = where;
      continue;
    }
    if (type->kind() != pickle::Kind::kStr || type->as_str() != kDpReshardable) {
      return InvalidArgumentError(what + ": " + where + "/param_state_sharding_type " + type->DebugString() +
                                  ": a save of Megatron-Core's distributed optimizer in a form ptcfs does not take "
                                  "(it takes dp_reshardable, Megatron-LM's default; docs/megatron_format.md, \"The "
                                  "distributed optimizer in torch_dist\"); nothing was changed");
    }
    any = true;
  }
  if (any && !without.empty()) {
    return InvalidArgumentError(what + ": " + without +
                                " has no param_state_sharding_type beside a part of the distributed optimizer's "
                                "dp_reshardable form: a chain of a distributed and another optimizer, which ptcfs "
                                "does not take; nothing was changed");
  }
  return any;
}

}  // namespace ptc::megatron
