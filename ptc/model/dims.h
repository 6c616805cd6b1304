// Model dimensions, written "layers=4,hidden=64,heads=4,vocab=1024,seq=128"
// with optional ffn= (default 4*hidden), kv_heads= (default heads) and
// head_dim= (default hidden/heads). Schema shape formulas refer to these names.
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

  // The value of a dimension by name ("hidden", "kv_heads", ...).
  std::optional<Index> Lookup(std::string_view name) const;
  // Canonical text with every field; ParseDims(ToString()) round-trips.
  std::string ToString() const;
  friend bool operator==(const ModelDims&, const ModelDims&) = default;
};

// \error InvalidArgument naming the key: unknown key, missing required key
//   (layers, hidden, heads, vocab, seq), non-positive value, heads not a
//   multiple of kv_heads, hidden not a multiple of heads without head_dim.
Result<ModelDims> ParseDims(std::string_view text);

}  // namespace ptc
