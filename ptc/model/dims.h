// Model dimensions, written "layers=4,hidden=64,heads=4,vocab=1024,seq=128"
// with optional ffn= (default 4*hidden), kv_heads= (default heads) and
// head_dim= (default hidden/heads). Schema shape formulas refer to these names.
//
// Mixture of experts: experts= (routed experts per MoE layer; 0 or absent: a
// dense model), moe_ffn= (each expert's ffn size, default ffn), shared_ffn=
// (the shared experts' ffn size, 0 = none), and which layers are MoE:
// moe_every=k (layer l when l % k == 0, as Megatron-Core's moe_layer_freq)
// and dense_first=k (layers below k stay dense, as DeepSeek-V3's
// first_k_dense_replace); a layer is MoE when both say so.
//
// Multi-head latent attention (DeepSeek-V3's MLA): kv_lora= (the rank of the
// compressed kv; 0 or absent: llama's attention), q_lora= (the rank of the
// compressed q; 0: one q projection), qk_nope= and qk_rope= (each head's q/k
// rows without and with rotary embedding) and v_head= (each head's v rows,
// default qk_nope). With MLA kv_heads is heads and head_dim is qk_rope (as
// Hugging Face's DeepseekV3Config has it); formulas read v_head as head_dim in
// a model without MLA, so one linear_proj rule serves both.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ptc/base/status.h"
#include "ptc/model/box.h"

namespace ptc {

struct ModelDims {
  Index layers = 0;
  Index hidden = 0;
  Index heads = 0;
  Index vocab = 0;
  Index seq = 0;
  Index ffn = 0;
  Index kv_heads = 0;
  Index head_dim = 0;
  Index experts = 0;  // 0: dense; the fields below only mean something with experts
  Index moe_ffn = 0;
  Index shared_ffn = 0;
  Index moe_every = 1;
  Index dense_first = 0;
  Index q_lora = 0;  // MLA (kv_lora > 0): the fields below only mean something with it
  Index kv_lora = 0;
  Index qk_nope = 0;
  Index qk_rope = 0;
  Index v_head = 0;

  bool IsMoeLayer(Index layer) const {
    return experts > 0 && layer >= dense_first && layer % moe_every == 0;
  }
  Index MoeLayers() const;
  bool IsMla() const { return kv_lora > 0; }

  // The value of a dimension by name ("hidden", "kv_heads", ...); "v_head" is
  // head_dim in a model without MLA.
  std::optional<Index> Lookup(std::string_view name) const;
  // Canonical text with every field (the MoE ones only with experts, the MLA
  // ones only with kv_lora);
  // ParseDims(ToString()) round-trips.
  std::string ToString() const;
  friend bool operator==(const ModelDims&, const ModelDims&) = default;
};

// \error InvalidArgument naming the key: unknown key, missing required key
//   (layers, hidden, heads, vocab, seq), non-positive value (experts,
//   shared_ffn and dense_first may be 0), heads not a multiple of kv_heads,
//   hidden not a multiple of heads without head_dim, experts above
//   kMaxExperts, an MoE key without experts, no MoE layer left by
//   moe_every and dense_first; an MLA key without kv_lora, kv_lora without
//   qk_nope or qk_rope, an odd qk_rope, kv_heads other than heads or head_dim
//   other than qk_rope with kv_lora.
Result<ModelDims> ParseDims(std::string_view text);

}  // namespace ptc
