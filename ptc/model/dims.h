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

  bool IsMoeLayer(Index layer) const {
    return experts > 0 && layer >= dense_first && layer % moe_every == 0;
  }
  Index MoeLayers() const;

  // The value of a dimension by name ("hidden", "kv_heads", ...).
  std::optional<Index> Lookup(std::string_view name) const;
  // Canonical text with every field (the MoE ones only with experts);
  // ParseDims(ToString()) round-trips.
  std::string ToString() const;
  friend bool operator==(const ModelDims&, const ModelDims&) = default;
};

// \error InvalidArgument naming the key: unknown key, missing required key
//   (layers, hidden, heads, vocab, seq), non-positive value (experts,
//   shared_ffn and dense_first may be 0), heads not a multiple of kv_heads,
//   hidden not a multiple of heads without head_dim, experts above
//   kMaxExperts, an MoE key without experts, no MoE layer left by
//   moe_every and dense_first.
Result<ModelDims> ParseDims(std::string_view text);

}  // namespace ptc
