#include "ptc/model/builtin_schemas.h"

namespace ptc {
namespace {

// Megatron-LM legacy (GPTModel) names. Query/key/value are interleaved per
// head, so tp splits them by heads.
// The rules are in legacy Megatron's registration order: ParallelAttention
// builds query_key_value before dense; each linear its weight, then its bias.
constexpr std::string_view kMegatronGpt = R"json({
  "name": "megatron-gpt",
  "tensors": [
    {"name": "language_model.embedding.word_embeddings.weight", "shape": ["vocab", "hidden"],
     "tp": {"dim": 0}, "pp": "first"},
    {"name": "language_model.embedding.position_embeddings.weight", "shape": ["seq", "hidden"], "pp": "first"},
    {"name": "language_model.encoder.layers.{i}.input_layernorm.weight", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.input_layernorm.bias", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.self_attention.query_key_value.weight",
     "shape": ["3*hidden", "hidden"], "tp": {"dim": 0, "units": "heads"}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.self_attention.query_key_value.bias",
     "shape": ["3*hidden"], "tp": {"dim": 0, "units": "heads"}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.self_attention.dense.weight",
     "shape": ["hidden", "hidden"], "tp": {"dim": 1, "units": "heads"}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.self_attention.dense.bias", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.post_attention_layernorm.weight", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.post_attention_layernorm.bias", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.mlp.dense_h_to_4h.weight",
     "shape": ["ffn", "hidden"], "tp": {"dim": 0}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.mlp.dense_h_to_4h.bias", "shape": ["ffn"], "tp": {"dim": 0}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.mlp.dense_4h_to_h.weight",
     "shape": ["hidden", "ffn"], "tp": {"dim": 1}, "pp": "layer"},
    {"name": "language_model.encoder.layers.{i}.mlp.dense_4h_to_h.bias", "shape": ["hidden"], "pp": "layer"},
    {"name": "language_model.encoder.final_layernorm.weight", "shape": ["hidden"], "pp": "last"},
    {"name": "language_model.encoder.final_layernorm.bias", "shape": ["hidden"], "pp": "last"},
    {"name": "word_embeddings_for_head.weight", "tied_to": "language_model.embedding.word_embeddings.weight",
     "tp": {"dim": 0}, "pp": "last"}
  ]
})json";

// Megatron-Core GPT with GQA and SwiGLU (Llama). linear_qkv rows are grouped
// per query group ([q x heads/kv_heads, k, v] per group), so tp splits by
// query group; linear_fc1 holds [gate; up], each split on its own.
// The rules are in the order Megatron-Core's GPTModel registers its
// parameters with Transformer Engine (the order of named_parameters(), which
// numbers the optimizer state): Attention.__init__ builds linear_proj before
// SelfAttention adds linear_qkv, whose fused norm weight TE registers first.
// With dims experts= the MoE layers (ModelDims::IsMoeLayer) replace the dense
// MLP by Megatron-Core's MoELayer: pre_mlp_layernorm (a norm of its own, not
// fused), then the router [experts, hidden], the routed experts (each its own
// SwiGLU fc1 [gate; up] and fc2 of moe_ffn, split over etp; {e} is the global
// expert id in global names and the rank's local index in local names) and,
// with shared_ffn, the shared experts (split over tp like a dense MLP), in the
// order MoELayer.__init__ builds them. A dense model has none of these.
// With dims kv_lora= the attention is Megatron-Core's MLASelfAttention under
// its Transformer Engine spec with qk_layernorm (DeepSeek-V3's): a norm of its
// own before it (TENorm input_layernorm), linear_proj (built first, by
// MultiLatentAttention), then linear_q_proj (q_lora=0) or linear_q_down_proj
// and linear_q_up_proj (its fused norm, the q norm, registered first),
// linear_kv_down_proj and linear_kv_up_proj (its fused kv norm first). The
// down projections and norms are whole on every tp rank (TELinear
// "duplicated"); the up projections, q_proj and linear_proj are split by
// heads. Without kv_lora these rules have no tensor and linear_qkv's have.
constexpr std::string_view kLlama = R"json({
  "name": "llama",
  "tensors": [
    {"name": "embedding.word_embeddings.weight", "shape": ["vocab", "hidden"], "tp": {"dim": 0}, "pp": "first"},
    {"name": "decoder.layers.{i}.input_layernorm.weight", "shape": ["hidden"], "pp": "layer", "when": "kv_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_proj.weight",
     "shape": ["hidden", "heads*v_head"], "tp": {"dim": 1, "units": "heads"}, "pp": "layer"},
    {"name": "decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight", "shape": ["hidden"], "pp": "layer",
     "when": "!kv_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_qkv.weight",
     "shape": ["(heads+2*kv_heads)*head_dim", "hidden"], "tp": {"dim": 0, "units": "kv_heads"}, "pp": "layer",
     "when": "!kv_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_q_proj.weight",
     "shape": ["heads*(qk_nope+qk_rope)", "hidden"], "tp": {"dim": 0, "units": "heads"}, "pp": "layer",
     "when": "kv_lora*!q_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_q_down_proj.weight", "shape": ["q_lora", "hidden"],
     "pp": "layer", "when": "q_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_q_up_proj.layer_norm_weight", "shape": ["q_lora"],
     "pp": "layer", "when": "q_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_q_up_proj.weight",
     "shape": ["heads*(qk_nope+qk_rope)", "q_lora"], "tp": {"dim": 0, "units": "heads"}, "pp": "layer",
     "when": "q_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_kv_down_proj.weight", "shape": ["kv_lora+qk_rope", "hidden"],
     "pp": "layer", "when": "kv_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_kv_up_proj.layer_norm_weight", "shape": ["kv_lora"],
     "pp": "layer", "when": "kv_lora"},
    {"name": "decoder.layers.{i}.self_attention.linear_kv_up_proj.weight",
     "shape": ["heads*(qk_nope+v_head)", "kv_lora"], "tp": {"dim": 0, "units": "heads"}, "pp": "layer",
     "when": "kv_lora"},
    {"name": "decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight", "shape": ["hidden"], "pp": "layer",
     "layers": "dense"},
    {"name": "decoder.layers.{i}.mlp.linear_fc1.weight",
     "shape": ["2*ffn", "hidden"], "tp": {"dim": 0, "segments": 2}, "pp": "layer", "layers": "dense"},
    {"name": "decoder.layers.{i}.mlp.linear_fc2.weight", "shape": ["hidden", "ffn"], "tp": {"dim": 1}, "pp": "layer",
     "layers": "dense"},
    {"name": "decoder.layers.{i}.pre_mlp_layernorm.weight", "shape": ["hidden"], "pp": "layer", "layers": "moe"},
    {"name": "decoder.layers.{i}.mlp.router.weight", "shape": ["experts", "hidden"], "pp": "layer", "layers": "moe"},
    {"name": "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight",
     "shape": ["2*moe_ffn", "hidden"], "tp": {"dim": 0, "segments": 2}, "pp": "layer"},
    {"name": "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight",
     "shape": ["hidden", "moe_ffn"], "tp": {"dim": 1}, "pp": "layer"},
    {"name": "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight",
     "shape": ["2*shared_ffn", "hidden"], "tp": {"dim": 0, "segments": 2}, "pp": "layer", "layers": "moe",
     "when": "shared_ffn"},
    {"name": "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight",
     "shape": ["hidden", "shared_ffn"], "tp": {"dim": 1}, "pp": "layer", "layers": "moe", "when": "shared_ffn"},
    {"name": "decoder.final_layernorm.weight", "shape": ["hidden"], "pp": "last"},
    {"name": "output_layer.weight", "shape": ["vocab", "hidden"], "tp": {"dim": 0}, "pp": "last"}
  ]
})json";

}  // namespace

std::string_view BuiltinSchemaText(std::string_view name) {
  if (name == "megatron-gpt") return kMegatronGpt;
  if (name == "llama") return kLlama;
  return {};
}

}  // namespace ptc
