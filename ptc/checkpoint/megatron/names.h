// Megatron-Core's two name sets for the same model (docs/megatron_format.md,
// "Two name sets"). With Transformer Engine (`te`, the built-in llama schema's
// names: the store's canonical ones) a layer's norms are fused into the linear
// after them; without it (`local`: the local layer spec, every CPU machine)
// they are modules of their own:
//
//   te                                         local
//   P.self_attention.linear_qkv.layer_norm_weight   P.input_layernorm.weight
//   P.self_attention.linear_qkv.layer_norm_bias     P.input_layernorm.bias
//   P.mlp.linear_fc1.layer_norm_weight              P.pre_mlp_layernorm.weight
//   P.mlp.linear_fc1.layer_norm_bias                P.pre_mlp_layernorm.bias
//   P.self_attention.linear_q_up_proj.layer_norm_weight   P.self_attention.q_layernorm.weight   (MLA)
//   P.self_attention.linear_kv_up_proj.layer_norm_weight  P.self_attention.kv_layernorm.weight  (MLA)
//
// The order differs too, and it numbers the optimizer state: TransformerLayer
// registers input_layernorm before self_attention and pre_mlp_layernorm before
// mlp, where TE registers each norm inside its linear (after linear_proj for
// linear_qkv's). So a local model's named_parameters() put P.input_layernorm.*
// right before P's first self_attention tensor, P.pre_mlp_layernorm.* right
// before P's first mlp tensor; MLA's q and kv norms (MLASelfAttention builds
// them after its linears) right before P.pre_mlp_layernorm.* or, in a dense
// layer, its mlp; everything else keeps the te order. (The local spec's MLA
// also splits its down projections over tp, ColumnParallelLinear, where TE's
// keeps them whole: MLA's local names are rendered at tp=1 only.)
//
// Routed experts (mixture of experts; the schema's names are SequentialMLP's,
// the local spec's): `te` is Transformer Engine's TEGroupedMLP (moe_grouped_gemm),
// one grouped linear per matrix holding every local expert K as `weightK`:
//
//   te                                         local
//   P.mlp.experts.linear_fc1.weightK           P.mlp.experts.local_experts.K.linear_fc1.weight
//   P.mlp.experts.linear_fc2.weightK           P.mlp.experts.local_experts.K.linear_fc2.weight
//
// registered linear by linear (fc1 of every expert, then fc2), where
// SequentialMLP registers expert by expert. K is the rank's local expert
// index (global expert ep_rank * experts/ep + K). An MoE layer's
// pre_mlp_layernorm, router and shared experts have one name in both sets.
//
// A pure mapping at the format edge: the store keeps one name per tensor (the
// schema's), a rank file is rendered, and recognised on import, in either set.
// A schema without TE's fused names (megatron-gpt, a custom schema written in
// local names) has the same names and order in both.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

// kTeSequential: Transformer Engine's spec without grouped GEMM
// (get_gpt_layer_with_transformer_engine_spec, moe_grouped_gemm off: its
// fused norms, SequentialMLP's experts of TE linears), which is the schema's
// own names and order; recognised in files (imports and saves), not a
// rendering choice (--names is te or local).
enum class NameSet { kTe, kLocal, kTeSequential };

// "te" or "local".
// \error InvalidArgument naming the text and the two names.
Result<NameSet> ParseNameSet(std::string_view text);
std::string_view NameSetName(NameSet names);

// The name in `names` of the tensor called `name` in the schema's names (a
// local or a global name); unchanged when it is no fused norm or routed expert.
std::string NameIn(NameSet names, std::string_view name);

// Whether a rank's parameter is a routed expert's (its global tensor named
// "*.mlp.experts.local_experts.K.*"): Megatron-Core gives those to the
// expert-parallel optimizer (is_expert_parallel, param.allreduce False).
bool IsExpertParameter(const LocalTensor& param);

// The order in which a model in `names` registers the parameters `te_order`
// (the schema's names, in its order): indices into te_order.
std::vector<size_t> RegistrationOrder(NameSet names, const std::vector<std::string>& te_order);

// The local spec's MLA cuts its down projections over tp (ColumnParallelLinear,
// gather_output off) where Transformer Engine's keeps them whole (TELinear,
// "duplicated"): the store's rules are TE's, so MLA in local names is rendered
// and read at tp=1 only.
// \error InvalidArgument naming the tensor, for kLocal with tp > 1 and an MLA down projection.
Status CheckNameSetSplits(NameSet names, int tp, const RankView& view);

// `view` (te names, the schema's order) as a model in `names` saves it: its
// model tensors renamed and in that model's order, its optimizer state
// tensors ("P.exp_avg", ...) renamed in their place. `from`, when given, gets
// for each model tensor of the result its index in view.model.
RankView ViewInNameSet(const RankView& view, NameSet names, std::vector<size_t>* from = nullptr);

// The name set of a rank file: `has(name)` says whether the file holds a model
// tensor of that local name. The first fused norm of `view` (te names) that
// the file holds in one set decides the norms', the first routed expert the
// experts' (TEGroupedMLP's or SequentialMLP's): te norms with grouped experts
// are kTe, local ones with sequential experts kLocal, te norms with sequential
// experts kTeSequential; te when it holds neither kind in either.
// `where(name)` names a local name's place in the file in messages.
// \error InvalidArgument naming the first tensor in the other set (or in both)
//        and the tensor that decided; local norms with grouped experts (no
//        spec of megatron-core names so).
Result<NameSet> RecogniseNameSet(const RankView& view, const std::function<bool(const std::string&)>& has,
                                 const std::function<std::string(const std::string&)>& where);

}  // namespace ptc::megatron
