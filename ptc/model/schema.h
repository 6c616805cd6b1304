// Schemas: the rules that say, for every global tensor of a model, its shape
// and how each mesh axis partitions it. See docs/schema_format.md.
//
// A rule:
//   {"name": "decoder.layers.{i}.mlp.linear_fc1.weight",   // {i}: layer index local to the stage
//    "shape": ["2*ffn", "hidden"],                           // formulas over the model dims
//    "tp": {"dim": 0, "segments": 2, "units": "ffn"},        // absent: replicated over tp
//    "pp": "layer"}                                          // "layer" | "first" | "last"
// "segments": the dim is cut into that many equal parts and each is split over
// tp on its own; rank r holds [part_0 of r; part_1 of r; ...] ([gate_r; up_r]).
// "units": how many indivisible units one segment holds (heads, query groups);
// tp must divide it. Default: the segment's size.
// "tied_to": this placement holds the same global tensor as the named rule
// (tied embeddings); it is omitted on stages that already hold that tensor.
//
// Mixture of experts (docs/schema_format.md):
//   "layers": "dense" | "moe" (default "all"): a per-layer rule only on the
//     dense or only on the MoE layers (ModelDims::IsMoeLayer).
//   "{e}" in the name: an expert rule, one tensor per routed expert of each
//     MoE layer (global names: the global expert id; local names: the index
//     among the rank's experts). Its tp split is made over etp, and ep places
//     whole experts.
//   "when": a formula over the dims; the rule exists only where it is not 0
//     ("shared_ffn": the shared experts).
//
// "buffer": true: the rule's tensors are model state but no parameter (a
// persistent buffer, as the router's expert bias is in Megatron-Core,
// torchtitan and Hugging Face): in every view and format of the model, moved
// like any tensor, but with no optimizer state (HasOptimizerState, view.h).
//
// Global tensor names use the global layer index for {i}; local names (what a
// rank's files call the tensor) use the index local to the pipeline stage.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ptc/base/status.h"

namespace ptc {

enum class PpPlacement { kLayer, kFirst, kLast };
enum class LayerKind { kAll, kDense, kMoe };

struct TpRule {
  bool split = false;
  int dim = 0;
  int segments = 1;
  std::string units;  // formula; empty = the segment size
};

struct TensorRule {
  std::string name;                // pattern; contains "{i}" exactly when pp is kLayer
  std::vector<std::string> shape;  // formulas; empty for a tied rule (taken from its target)
  TpRule tp;
  PpPlacement pp = PpPlacement::kLayer;
  std::string tied_to;  // name of another (non-layer) rule, or empty
  LayerKind layers = LayerKind::kAll;  // with kLayer: which layers hold it
  bool expert = false;                 // the name has "{e}" (then layers is kMoe)
  std::string when;                    // formula; empty: always
  bool buffer = false;                 // "buffer": model state without optimizer state
};

struct Schema {
  std::string name;
  std::vector<TensorRule> rules;

  nlohmann::json ToJson() const;
  // The rule of that name, or nullptr. A linear search: index `rules` by name
  // for many look-ups.
  const TensorRule* Find(std::string_view name) const;
};

// Parses and checks a schema document. `label` (a file path or a built-in
// name) starts every error message.
// \error InvalidArgument naming the rule: missing or mistyped field, unknown
//   "pp" value, "{i}" with a non-layer placement or missing with "layer",
//   tp.dim outside the shape, segments < 1, tied_to naming no non-layer rule,
//   duplicate rule names, a name that fails ValidateTensorName (with {i} and
//   {e} as 0) or is too long to take a layer index and an optimizer suffix,
//   "layers" other than all/dense/moe or on a non-layer rule, "{e}" twice,
//   on a non-layer rule or with "layers": "dense", "when" not a formula,
//   "buffer" not a boolean or on a tied rule or its target.
Result<Schema> ParseSchema(std::string_view label, const nlohmann::json& doc);
// A built-in name ("megatron-gpt", "llama") or the path of a JSON file.
// \error NotFound when it is neither; InvalidArgument as ParseSchema.
Result<Schema> LoadSchema(const std::string& name_or_path);
std::vector<std::string> BuiltinSchemaNames();

}  // namespace ptc
