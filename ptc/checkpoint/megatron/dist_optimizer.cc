#include "ptc/checkpoint/megatron/dist_optimizer.h"

#include <algorithm>
#include <cstring>
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

// The parameters of domain (tp, pp) in the registration order of `names`, checked.
// \error FailedPrecondition as PlanDpReshardable's.
Result<std::vector<LocalTensor>> DomainParams(const ModelLayout& layout, NameSet names, int tp, int pp) {
  RankCoords k;
  k.tp = tp, k.pp = pp;
  PTC_ASSIGN_OR_RETURN(const RankView view, layout.View(layout.config().RankOf(k)));
  std::vector<std::string> te_order;
  for (const LocalTensor& t : view.model) te_order.push_back(t.name);
  std::vector<LocalTensor> params;
  for (size_t i : RegistrationOrder(names, te_order)) params.push_back(view.model[i]);
  for (const LocalTensor& p : params) {
    // At ep = 1 a routed expert is an ordinary parameter (Megatron-Core's param.allreduce is
    // False only with expert parallelism); at ep > 1 it is in the expert-parallel buffers.
    if (IsExpertParameter(p) && layout.config().ep > 1) {
      return FailedPreconditionError(p.name +
                                     ": at ep > 1 a routed expert's state is in the expert-parallel optimizer's "
                                     "buffers, whose dp_reshardable form ptcfs does not render yet");
    }
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

}  // namespace

Result<DpReshardable> PlanDpReshardable(const ModelLayout& layout, NameSet names, const MegatronState& state) {
  const ParallelConfig& config = layout.config();
  for (const TensorRule& rule : layout.spec().schema.rules) {
    if (!rule.tied_to.empty() && config.pp > 1) {
      return FailedPreconditionError("rule '" + rule.name + "' is tied to '" + rule.tied_to +
                                     "' across pipeline stages: Megatron's shared-embedding buckets of the "
                                     "distributed optimizer are not rendered yet");
    }
  }
  PTC_ASSIGN_OR_RETURN(const Value step, CommonStep(state));
  DpReshardable out;
  Value groups = Value::List();
  for (size_t g : {size_t{0}, size_t{1}}) {
    Value settings = RenderedSettings(state.optimizer, g);
    settings.Set("step", step);
    groups.items().push_back(std::move(settings));
  }
  const int dp = config.dense_zero_ranks();
  for (int pp = 0; pp < config.pp; ++pp) {
    for (int tp = 0; tp < config.tp; ++tp) {
      PTC_ASSIGN_OR_RETURN(const std::vector<LocalTensor> params, DomainParams(layout, names, tp, pp));
      std::vector<DdpParam> sizes;
      for (const LocalTensor& p : params) sizes.push_back({NumElements(p.shape)});
      PTC_ASSIGN_OR_RETURN(const DdpBuffer buffer, LayOutDdpBuffer(sizes, {dp}));
      const DType grad = params.front().dtype == DType::kF16 ? DType::kF16 : DType::kF32;
      const std::string dtypes =
          "(torch." + std::string(TorchName(params.front().dtype)) + ", torch." + std::string(TorchName(grad)) + ")";
      const std::string prefix = "optimizer.distributed.dp_group_idx_" + std::to_string(tp + config.tp * pp) + ".";
      const std::string gbuf = prefix + "gbuf_idx_0.dtype_" + dtypes + ".";
      PTC_RETURN_IF_ERROR(CheckEveryRankHoldsAParameter(buffer, dp, gbuf));
      Value numel = Value::List(), unpadded = Value::List();
      for (size_t b = 0; b < buffer.buckets.size(); ++b) {
        numel.items().push_back(Value::Int(buffer.buckets[b].numel));
        unpadded.items().push_back(Value::Int(buffer.buckets[b].numel_unpadded));
        for (const auto& [name, suffix] : kStates) {
          const std::string key = gbuf + "bucket_idx_" + std::to_string(b) + "." + name;
          out.tensors.push_back(BucketState(key, buffer, b, params, suffix));
        }
      }
      const Value dtype_key = Value::Tuple({TorchDType(params.front().dtype), TorchDType(grad)});
      out.objects.emplace_back(prefix + "optimizer/shard_0_1", Value::Dict({{Value::Str("param_groups"), groups}}));
      out.objects.emplace_back(prefix + "per_bucket_numel/shard_0_1",
                               Value::List({Value::Dict({{dtype_key, std::move(numel)}})}));
      out.objects.emplace_back(prefix + "per_bucket_numel_unpadded/shard_0_1",
                               Value::List({Value::Dict({{dtype_key, std::move(unpadded)}})}));
    }
  }
  out.common = Value::Dict({{Value::Str("param_state_sharding_type"), Value::Str(kDpReshardable)}});
  return out;
}

Status RefuseDistributedOptimizerSave(const Value& optimizer, const std::string& what) {
  if (!optimizer.is_dict()) return Status::OK();
  std::vector<std::pair<std::string, const Value*>> parts = {{"optimizer", &optimizer}};
  for (const auto& [k, v] : optimizer.pairs()) {
    if (k.kind() == pickle::Kind::kInt && v.is_dict()) parts.emplace_back("optimizer/" + std::to_string(k.as_int()), &v);
  }
  for (const auto& [where, part] : parts) {
    const Value* type = part->Find("param_state_sharding_type");
    if (type == nullptr) continue;
    return InvalidArgumentError(what + ": " + where + "/param_state_sharding_type " + type->DebugString() +
                                ": a save of Megatron-Core's distributed optimizer (--use-distributed-optimizer), "
                                "which ptcfs does not take yet (docs/megatron_format.md, \"The distributed "
                                "optimizer in torch_dist\"); nothing was changed");
  }
  return Status::OK();
}

}  // namespace ptc::megatron
