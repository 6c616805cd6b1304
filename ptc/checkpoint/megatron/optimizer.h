// The optimizer state of a Megatron-LM rank file (docs/megatron_format.md),
// as Megatron-LM saves it with its non-distributed optimizer: a
// Float16OptimizerWithFloat16Params wrapping torch.optim.Adam,
//
//   'optimizer': {'optimizer': {'state': {k: {'step', 'exp_avg', 'exp_avg_sq'}},
//                               'param_groups': [{'lr', 'betas', ..., 'wd_mult', ..., 'params': [k...]},
//                                                {... 'params': [k...]}]},
//                 'grad_scaler': {...} (fp16 runs; kept with the carried entries),
//                 'fp32_from_fp16_params': [[fp32 master of each parameter of group 0], [... group 1]]}
//
// Megatron splits a rank's parameters into two groups (megatron/core/optimizer
// _get_param_groups): group 0 with weight decay, group 1 without (1-D
// parameters and biases: `len(param.shape) == 1 or name.endswith(".bias")`),
// each in the order of the model's named_parameters (the rank's model
// tensors but its buffers, which have no optimizer state: HasOptimizerState).
// torch's Optimizer.state_dict() numbers the parameters consecutively across
// groups: group 0 holds 0..a-1, group 1 a..n-1, and 'state' is keyed by those
// numbers.
//
// A model with routed experts at ep > 1 has Megatron-Core's ChainedOptimizer
// instead (an expert's parameters are expert-parallel, `allreduce` False, only
// when expert_model_parallel_size > 1: megatron/core/tensor_parallel/layers.py),
// whose state_dict() is a list of its two optimizers' (megatron/core/optimizer
// get_megatron_optimizer):
//
//   'optimizer': [{... the dense parameters, as above, is_expert_parallel False},
//                 {... the experts' parameters (IsExpertParameter): their groups only
//                  (one when every expert parameter is a 2-D weight; one without
//                  parameters on a stage without MoE layers), is_expert_parallel True}]
//
// each numbered from 0 and in the model's named_parameters order.
//
// Import reads that layout, and the one-group layout ptcfs rendered before
// (one group of every parameter in the model's order). Rendering always
// writes Megatron's two groups.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/format/pickle.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

// Megatron's rule: no weight decay for 1-D parameters and biases.
bool WithoutWeightDecay(const LocalTensor& param);

// Where each of a rank's parameters has its optimizer state in a file.
struct OptimizerLayout {
  struct Slot {
    size_t group = 0;     // the file's param group
    size_t position = 0;  // in that group's 'params' (and fp32_from_fp16_params list)
    pickle::Value key;    // the key of its entry in 'state'
    int chain = -1;       // its optimizer in a ChainedOptimizer's list (0 dense, 1 experts); -1: one optimizer
  };
  std::vector<Slot> slots;          // one per view.model entry (a buffer's, HasOptimizerState false: unused)
  std::vector<size_t> file_groups;  // the (dense) file's group of Megatron's group g (one entry: a one-group file)
  std::vector<size_t> expert_groups;  // chained: Megatron's group of each of the expert optimizer's file groups
  bool chained = false;               // 'optimizer' is [dense, expert-parallel]
};

// The layout of `optimizer` (the state dict's 'optimizer' entry) for the
// parameters of `view`: Megatron's two groups (the one without weight decay
// is the group whose wd_mult, else whose weight_decay, is 0; else the
// second), or one group of every parameter. `what` names the file.
// \error InvalidArgument naming the file and the entry: no 'optimizer' or
//        'param_groups', a group without a list of int 'params', a number of
//        groups other than 1 or 2, groups whose sizes are not those of the
//        rank's parameters split by Megatron's rule (the sizes named).
Result<OptimizerLayout> ReadOptimizerLayout(const RankView& view, const pickle::Value& optimizer,
                                            const std::string& what);

// The keys from the state dict's root to the `kind` (exp_avg, exp_avg_sq,
// step, fp32) of parameter i of the layout's view.
std::vector<pickle::Value> OptimizerPath(const OptimizerLayout& layout, std::string_view kind, size_t i);

// The settings of the file's groups in Megatron's order: a list of dicts
// without 'params'. REQUIRES: `layout` was read from `optimizer`.
pickle::Value GroupSettings(const OptimizerLayout& layout, const pickle::Value& optimizer);

// The settings of a chained file's expert-parallel groups (OptimizerMeta::
// expert_groups: by Megatron's group, None for one it lacks or that holds no
// parameter); an empty list for one optimizer. REQUIRES: as GroupSettings.
pickle::Value ExpertGroupSettings(const OptimizerLayout& layout, const pickle::Value& optimizer);

// Sets out->root["optimizer"] to the rank's optimizer state in Megatron's
// layout (keeping the carried 'optimizer' entries, e.g. 'grad_scaler').
// `add` makes the tensor value of a local tensor and its storage. Each
// state's step comes from meta.steps by the parameter's global name; a
// parameter without one gets float32 `iteration` (torch Adam counts from
// it). Each group's settings are meta.groups's, or torch Adam's defaults with
// Megatron's wd_mult and lr_mult (docs/megatron_format.md). With
// `expert_parallel` (a model with experts at ep > 1) Megatron-Core's
// ChainedOptimizer: the dense parameters' optimizer, then the experts'.
// REQUIRES: view.optim holds the exp_avg, exp_avg_sq and fp32 of each of
// view.model's parameters (zero=0).
void RenderOptimizer(const RankView& view, const OptimizerMeta& meta, uint64_t iteration, bool expert_parallel,
                     const std::function<pickle::Value(const LocalTensor&)>& add, RankState* out);

// Megatron's group g (0: with weight decay, 1: without) as rendered: the
// kept settings of two groups; else torch Adam's defaults with Megatron's
// keys, the kept ones of a single group over them (but for group 1's weight
// decay). A dict without 'params'.
pickle::Value RenderedSettings(const OptimizerMeta& meta, size_t g);
// The expert-parallel optimizer's group g as rendered (a model with experts
// at ep > 1): the kept expert group's settings, else RenderedSettings' with
// is_expert_parallel True.
pickle::Value RenderedExpertSettings(const OptimizerMeta& meta, size_t g);

// The step of parameter `param` (a global name) as rendered: its kept value
// (a number, or a 0-dim tensor of storage "s" with its bytes), else a float32
// tensor of `iteration`.
StepValue RenderedStep(const OptimizerMeta& meta, const std::string& param, uint64_t iteration);

// Megatron-Core's torch_dist checkpoints (ptc/checkpoint/dcp/dcp.h) keep the
// optimizer's tensors sharded (optimizer.state.{exp_avg,exp_avg_sq,fp32_param}.<key>)
// and the rest in common.pt, under the state dict's 'optimizer':
//
//   {'optimizer': {'param_groups': [{settings...} x 2], 'state': {'common_step': step}},
//    'grad_scaler': ... (kept)}                  Float16OptimizerWithFloat16Params (`masters`)
//   {'param_groups': [...], 'state': {'common_step': step}}     FP32Optimizer
//
// (its groups' 'params' are the loader's own, not saved). One step serves every
// parameter (Megatron-Core refuses to save steps that differ).

// That common part for `state`: the groups as RenderOptimizer writes them;
// the step that every parameter with one shares, else float32 `iteration`;
// the kept 'optimizer' entries (grad_scaler). The storages of its tensors go
// to *storages. With `expert_groups` (Megatron's groups, 0 with weight decay
// and 1 without, that hold a routed expert's parameter; a model with experts
// at ep > 1) Megatron-Core's ChainedOptimizer's, a dict by optimizer index as
// its sharded_state_dict leaves it: {0: the dense optimizer's part, 1: the
// expert-parallel one's}, the latter with those groups only,
// is_expert_parallel True, the same step (ChainedOptimizer synchronises them)
// and the same kept entries.
// \error FailedPrecondition naming two parameters whose steps differ.
Result<pickle::Value> McoreOptimizerCommon(const MegatronState& state, bool masters,
                                           std::vector<CarriedTensor>* storages,
                                           const std::vector<size_t>& expert_groups = {});

// What a saved common.pt's 'optimizer' entry (either layout, or a
// ChainedOptimizer's {0: dense, 1: expert-parallel} of them, whose dense part
// gives the groups and the other its expert_groups, by wd_mult) holds: the
// groups (Megatron's order: the one without weight decay second), one step
// for every name in `params` (float32 0 when the save has no common_step:
// Megatron-Core leaves out a step of 0), and
// the Float16 layout's other entries (grad_scaler; None when none) with their
// tensors' bytes (storages "g<n>").
struct McoreOptimizerCommonPart {
  OptimizerMeta meta;
  pickle::Value kept;
  std::vector<CarriedTensor> tensors{};
};
// `read` gives a tensor's bytes; `what` names the file.
// \error InvalidArgument naming the entry: no list of one or two dict groups,
//        a step that is not a number or a one-number tensor, a kept tensor
//        larger than kMaxCarriedTensorBytes; a chained entry whose keys are
//        not 0 and 1, or whose two steps differ.
Result<McoreOptimizerCommonPart> ReadMcoreOptimizerCommon(
    const pickle::Value& optimizer, const std::vector<std::string>& params,
    const std::function<Result<std::string>(const pickle::Tensor&)>& read, const std::string& what);

}  // namespace ptc::megatron
