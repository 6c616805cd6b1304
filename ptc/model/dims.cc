#include "ptc/model/dims.h"

#include <array>
#include <set>
#include <string>
#include <utility>

#include "ptc/base/kv_text.h"
#include "ptc/model/limits.h"

namespace ptc {
namespace {

using Field = Index ModelDims::*;
constexpr std::array<std::pair<std::string_view, Field>, 18> kFields = {{
    {"layers", &ModelDims::layers},
    {"hidden", &ModelDims::hidden},
    {"heads", &ModelDims::heads},
    {"vocab", &ModelDims::vocab},
    {"seq", &ModelDims::seq},
    {"ffn", &ModelDims::ffn},
    {"kv_heads", &ModelDims::kv_heads},
    {"head_dim", &ModelDims::head_dim},
    {"experts", &ModelDims::experts},
    {"moe_ffn", &ModelDims::moe_ffn},
    {"shared_ffn", &ModelDims::shared_ffn},
    {"moe_every", &ModelDims::moe_every},
    {"dense_first", &ModelDims::dense_first},
    {"q_lora", &ModelDims::q_lora},
    {"kv_lora", &ModelDims::kv_lora},
    {"qk_nope", &ModelDims::qk_nope},
    {"qk_rope", &ModelDims::qk_rope},
    {"v_head", &ModelDims::v_head},
}};
constexpr size_t kDenseFields = 8;  // the fields before "experts"
constexpr size_t kMoeEnd = 13;      // the MoE fields: [kDenseFields, kMoeEnd); then MLA's

bool MayBeZero(std::string_view key) {
  return key == "experts" || key == "shared_ffn" || key == "dense_first" || key == "q_lora" || key == "kv_lora";
}

// The MoE fields' rules, after the dense ones are known.
Status CheckMoe(const std::string& label, const std::set<std::string>& given, ModelDims& d) {
  if (d.experts == 0) {
    for (size_t i = kDenseFields + 1; i < kMoeEnd; ++i) {
      if (given.count(std::string(kFields[i].first))) {
        return InvalidArgumentError(label + ": " + std::string(kFields[i].first) +
                                    "= needs experts= (a mixture-of-experts model; experts=0 is dense)");
      }
    }
    return Status::OK();
  }
  if (d.experts > kMaxExperts) {
    return InvalidArgumentError(label + ": experts=" + std::to_string(d.experts) + " exceeds the limit of " +
                                std::to_string(kMaxExperts) + " experts per layer");
  }
  if (!given.count("moe_ffn")) d.moe_ffn = d.ffn;
  if (d.MoeLayers() == 0) {
    return InvalidArgumentError(label + ": dense_first=" + std::to_string(d.dense_first) + " and moe_every=" +
                                std::to_string(d.moe_every) + " leave no MoE layer among layers=" +
                                std::to_string(d.layers));
  }
  return Status::OK();
}

// The MLA fields' rules (before head_dim gets its default): each key needs
// kv_lora; kv_lora needs qk_nope and qk_rope; v_head defaults to qk_nope.
Status CheckMla(const std::string& label, const std::set<std::string>& given, ModelDims& d) {
  if (d.kv_lora == 0) {
    for (size_t i = kMoeEnd; i < kFields.size(); ++i) {
      if (given.count(std::string(kFields[i].first)) && kFields[i].first != "kv_lora") {
        return InvalidArgumentError(label + ": " + std::string(kFields[i].first) +
                                    "= needs kv_lora= (multi-head latent attention; kv_lora=0 is llama's attention)");
      }
    }
    return Status::OK();
  }
  for (const char* key : {"qk_nope", "qk_rope"}) {
    if (!given.count(key)) {
      return InvalidArgumentError(label + ": missing " + key + "= (kv_lora= is multi-head latent attention: " +
                                  "it needs qk_nope= and qk_rope=, the q/k rows of a head without and with RoPE)");
    }
  }
  if (d.qk_rope % 2 != 0) {
    return InvalidArgumentError(label + ": qk_rope=" + std::to_string(d.qk_rope) +
                                " is odd (rotary embedding turns pairs of rows)");
  }
  if (!given.count("v_head")) d.v_head = d.qk_nope;
  if (given.count("kv_heads") && d.kv_heads != d.heads) {
    return InvalidArgumentError(label + ": kv_heads=" + std::to_string(d.kv_heads) + " with kv_lora=: every head of " +
                                "multi-head latent attention has its own k and v (kv_heads is heads=" +
                                std::to_string(d.heads) + ")");
  }
  if (given.count("head_dim") && d.head_dim != d.qk_rope) {
    return InvalidArgumentError(label + ": head_dim=" + std::to_string(d.head_dim) + " with kv_lora=: head_dim is " +
                                "qk_rope=" + std::to_string(d.qk_rope) + " in multi-head latent attention " +
                                "(qk_nope, qk_rope and v_head give its heads' rows)");
  }
  d.head_dim = d.qk_rope;
  return Status::OK();
}

}  // namespace

std::optional<Index> ModelDims::Lookup(std::string_view name) const {
  if (name == "v_head" && !IsMla()) return head_dim;
  for (const auto& [key, field] : kFields) {
    if (key == name) return this->*field;
  }
  return std::nullopt;
}

Index ModelDims::MoeLayers() const {
  Index n = 0;
  for (Index l = 0; l < layers; ++l) n += IsMoeLayer(l);
  return n;
}

std::string ModelDims::ToString() const {
  std::string s;
  for (size_t i = 0; i < kFields.size(); ++i) {
    if ((i >= kDenseFields && i < kMoeEnd && !experts) || (i >= kMoeEnd && !IsMla())) continue;
    const auto& [key, field] = kFields[i];
    s += (s.empty() ? "" : ",") + std::string(key) + "=" + std::to_string(this->*field);
  }
  return s;
}

Result<ModelDims> ParseDims(std::string_view text) {
  const std::string label = "model dims '" + std::string(text) + "'";
  ModelDims d;
  std::set<std::string> given;
  PTC_ASSIGN_OR_RETURN(auto pairs, SplitKeyValues(text), label);
  for (const auto& [key, value] : pairs) {
    Field field = nullptr;
    for (const auto& [name, f] : kFields) {
      if (name == key) field = f;
    }
    if (field == nullptr) {
      return InvalidArgumentError(label + ": unknown key '" + key +
                                  "' (expected layers, hidden, heads, vocab, seq, ffn, kv_heads, head_dim, experts, "
                                  "moe_ffn, shared_ffn, moe_every, dense_first, q_lora, kv_lora, qk_nope, qk_rope, "
                                  "v_head)");
    }
    given.insert(key);
    if (MayBeZero(key) && value == "0") {
      d.*field = 0;
      continue;
    }
    PTC_ASSIGN_OR_RETURN(d.*field, ParsePositiveInt(value), label + ": " + key);
  }
  for (const char* required : {"layers", "hidden", "heads", "vocab", "seq"}) {
    if (*d.Lookup(required) == 0) return InvalidArgumentError(label + ": missing " + required + "=");
  }
  if (d.layers > kMaxLayers) {
    return InvalidArgumentError("model dims '" + CutForMessage(text) + "': layers=" + std::to_string(d.layers) +
                                " exceeds the limit of " + std::to_string(kMaxLayers) + " layers");
  }
  if (d.ffn == 0 && __builtin_mul_overflow(d.hidden, Index{4}, &d.ffn)) {
    return InvalidArgumentError(label + ": ffn = 4*hidden overflows (give ffn= explicitly)");
  }
  PTC_RETURN_IF_ERROR(CheckMla(label, given, d));
  if (d.kv_heads == 0) d.kv_heads = d.heads;
  if (d.heads % d.kv_heads != 0) {
    return InvalidArgumentError(label + ": heads=" + std::to_string(d.heads) +
                                " is not a multiple of kv_heads=" + std::to_string(d.kv_heads));
  }
  if (d.head_dim == 0) {
    if (d.hidden % d.heads != 0) {
      return InvalidArgumentError(label + ": hidden=" + std::to_string(d.hidden) + " is not a multiple of heads=" +
                                  std::to_string(d.heads) + " (give head_dim= explicitly)");
    }
    d.head_dim = d.hidden / d.heads;
  }
  PTC_RETURN_IF_ERROR(CheckMoe(label, given, d));
  return d;
}

}  // namespace ptc
