// Megatron-Core's DistributedOptimizer in a torch_dist checkpoint, its
// dp_reshardable form (megatron-core 0.16.1, Megatron-LM's default with
// --use-distributed-optimizer; docs/megatron_format.md, "The distributed
// optimizer in torch_dist"), of a store whose config has zero=1:
//
//   optimizer.distributed.dp_group_idx_G.gbuf_idx_0.dtype_(torch.P, torch.Gd).bucket_idx_b.{param,exp_avg,exp_avg_sq}
//       per (tp, pp) domain G = tp_rank + tp * pp_rank and DDP bucket b: a
//       float32 [numel_unpadded] tensor, the domain's parameters' fp32 masters
//       and moments at their places in the bucket (ddp_buffer.h), gaps zero;
//   optimizer.distributed.dp_group_idx_G.{optimizer,per_bucket_numel,per_bucket_numel_unpadded}/shard_0_1
//       ShardedObjects: the groups (Megatron's two, as the legacy render's,
//       each with the common `step`), the buckets' sizes by (P, Gd);
//   common.pt's optimizer: {"param_state_sharding_type": "dp_reshardable"}.
//
// Routed experts at ep = 1 are ordinary parameters of the one buffer. At ep > 1
// Megatron-Core's ChainedOptimizer holds a DistributedOptimizer of the dense
// parameters and one of the experts', each key prefixed chained_0. / chained_1.,
// common.pt's optimizer {0: ..., 1: ...}; the experts' domains are per
// (pp, ep, etp), G = etp_rank + etp * (ep_rank + ep * pp_rank), their buffer cut
// over edp, their groups those holding experts (is_expert_parallel); a stage
// without MoE layers has no expert domain.
//
// The buffer is Megatron-LM's default one: every parameter of a domain in one
// buffer of (its dtype, float32 gradients; float16 gradients for float16
// parameters), one bucket (overlap_grad_reduce off), over the dp x cp group,
// in the registration order of the name set's model (`names`: te or local).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/format/pickle.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

inline constexpr const char* kDpReshardable = "dp_reshardable";

// One optimizer's domain of the form: a (tp, pp) domain of the dense
// DistributedOptimizer, or a (pp, ep, etp) one of the expert-parallel one.
struct DpDomain {
  std::string prefix;  // of its keys: "[chained_k.]optimizer.distributed.dp_group_idx_G."
  std::string gbuf;    // its buffer's: prefix + "gbuf_idx_0.dtype_(torch.P, torch.Gd)."
  bool experts = false;
  std::vector<size_t> groups;                // Megatron's groups (0: with weight decay, 1: without) it holds
  pickle::Value dtypes;                      // (torch.P, torch.Gd)
  std::vector<Index> numel, numel_unpadded;  // per bucket
};

// Where every state of the form lies: each bucket state's key and segments
// (LocalTensor::name, F32, [numel_unpadded]; gaps are covered by none), by domain.
struct DpReshardableLayout {
  std::vector<LocalTensor> tensors;  // per domain, per bucket: param (the masters), exp_avg, exp_avg_sq
  std::vector<DpDomain> domains;     // the dense ones (G order), then the experts'
  bool chained = false;              // Megatron-Core's ChainedOptimizer (experts at ep > 1)
};

// That layout for `layout` in the registration order of `names`.
// \error FailedPrecondition naming the rule: embeddings tied across
//        pipeline stages (Megatron's shared_embedding buckets), a domain whose
//        parameters differ in dtype, a bucket some dp rank would hold no
//        parameter of (megatron-core cannot save or load it: "empty bucket");
//        InvalidArgument from the layout.
Result<DpReshardableLayout> LayOutDpReshardable(const ModelLayout& layout, NameSet names);

// A domain's per_bucket_numel (`padded`) or per_bucket_numel_unpadded object:
// [{(torch.P, torch.Gd): [the size of each bucket]}].
pickle::Value PerBucketNumel(const DpDomain& domain, bool padded);

// common.pt's 'optimizer' of the form: {"param_state_sharding_type": "dp_reshardable"}
// ({0: that, 1: that} for a ChainedOptimizer).
pickle::Value DpReshardableCommon(bool chained);

struct DpReshardable {
  std::vector<LocalTensor> tensors;  // each a bucket state's key (LocalTensor::name), F32, 1-D
  // The ShardedObjects: each key ("…/shard_0_1") and its value (saved as torch.save([value])).
  std::vector<std::pair<std::string, pickle::Value>> objects;
  pickle::Value common;  // common.pt's 'optimizer'
};

// That form for `layout` (zero=1, optimizer state) and `state`'s groups and step.
// \error as LayOutDpReshardable; FailedPrecondition when steps differ between parameters.
Result<DpReshardable> PlanDpReshardable(const ModelLayout& layout, NameSet names, const MegatronState& state);

// Whether a torch_dist save's common.pt 'optimizer' entry (`optimizer`, in
// file `what`) is Megatron-Core's DistributedOptimizer's dp_reshardable form
// (its 'param_state_sharding_type', or every ChainedOptimizer part's); false
// for an entry without one (the non-distributed optimizer).
// \error InvalidArgument naming the entry and the form: another form
//        (fully_reshardable, fully_sharded_model_space, ...), which ptcfs
//        does not take, or parts of different forms.
Result<bool> DpReshardableSave(const pickle::Value& optimizer, const std::string& what);

}  // namespace ptc::megatron
