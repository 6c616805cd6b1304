#include "ptc/model/dims.h"

#include <array>
#include <utility>

#include "ptc/base/kv_text.h"
#include "ptc/model/limits.h"

namespace ptc {
namespace {

using Field = Index ModelDims::*;
constexpr std::array<std::pair<std::string_view, Field>, 8> kFields = {{
    {"layers", &ModelDims::layers},
    {"hidden", &ModelDims::hidden},
    {"heads", &ModelDims::heads},
    {"vocab", &ModelDims::vocab},
    {"seq", &ModelDims::seq},
    {"ffn", &ModelDims::ffn},
    {"kv_heads", &ModelDims::kv_heads},
    {"head_dim", &ModelDims::head_dim},
}};

}  // namespace

std::optional<Index> ModelDims::Lookup(std::string_view name) const {
  for (const auto& [key, field] : kFields) {
    if (key == name) return this->*field;
  }
  return std::nullopt;
}

std::string ModelDims::ToString() const {
  std::string s;
  for (const auto& [key, field] : kFields) {
    s += (s.empty() ? "" : ",") + std::string(key) + "=" + std::to_string(this->*field);
  }
  return s;
}

Result<ModelDims> ParseDims(std::string_view text) {
  const std::string label = "model dims '" + std::string(text) + "'";
  ModelDims d;
  PTC_ASSIGN_OR_RETURN(auto pairs, SplitKeyValues(text), label);
  for (const auto& [key, value] : pairs) {
    Field field = nullptr;
    for (const auto& [name, f] : kFields) {
      if (name == key) field = f;
    }
    if (field == nullptr) {
      return InvalidArgumentError(label + ": unknown key '" + key +
                                  "' (expected layers, hidden, heads, vocab, seq, ffn, kv_heads, head_dim)");
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
  return d;
}

}  // namespace ptc
