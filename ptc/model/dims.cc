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
constexpr std::array<std::pair<std::string_view, Field>, 13> kFields = {{
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
}};
constexpr size_t kDenseFields = 8;  // the fields before "experts"

bool MayBeZero(std::string_view key) { return key == "experts" || key == "shared_ffn" || key == "dense_first"; }

// The MoE fields' rules, after the dense ones are known.
Status CheckMoe(const std::string& label, const std::set<std::string>& given, ModelDims& d) {
  if (d.experts == 0) {
    for (size_t i = kDenseFields + 1; i < kFields.size(); ++i) {
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

}  // namespace

std::optional<Index> ModelDims::Lookup(std::string_view name) const {
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
  for (size_t i = 0; i < (experts ? kFields.size() : kDenseFields); ++i) {
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
                                  "moe_ffn, shared_ffn, moe_every, dense_first)");
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
