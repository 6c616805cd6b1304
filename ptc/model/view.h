// Views: for one (model, parallel config, rank), the tensors the rank's files
// contain and where each of their elements lives in the global tensors.
//
// A LocalTensor is what a framework calls a tensor in a rank's file. Its
// Segments map boxes of global tensors into the local buffer (see box.h for
// Layout). A plain tp shard has one segment; a fused [gate; up] shard has two;
// a ZeRO-1 flat optimizer buffer has pieces of many global tensors, laid out
// with the strides of each parameter's local shard.
//
// Views are pure, deterministic functions: every worker computes the same.
#pragma once

#include <string>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/dtype.h"
#include "ptc/model/schema.h"

namespace ptc {

// What is being partitioned: schema, dims, the parameters' dtype and whether
// Adam state exists. Optimizer state is always F32: for every parameter P the
// global tensors "P.exp_avg", "P.exp_avg_sq" and "P.fp32" (master copy); a
// buffer (a rule with "buffer": true) has none.
struct ModelSpec {
  Schema schema;
  ModelDims dims;
  DType dtype = DType::kF32;
  bool optimizer = false;
};

inline constexpr const char* kOptimizerKinds[] = {"exp_avg", "exp_avg_sq", "fp32"};

struct GlobalTensor {
  std::string name;
  DType dtype;
  Shape shape;
  bool buffer = false;  // of a "buffer" rule: model state without optimizer state
};

struct Segment {
  std::string tensor;  // global tensor name
  Box box;             // in global coordinates
  Layout layout;       // where the box's elements are in the local buffer
  friend bool operator==(const Segment&, const Segment&) = default;
};

struct LocalTensor {
  std::string name;  // the framework's name in this rank's file
  DType dtype;
  Shape shape;
  std::vector<Segment> segments;  // disjoint; ZeRO padding is covered by none
  bool buffer = false;            // a model tensor of a "buffer" rule: no optimizer state
  friend bool operator==(const LocalTensor&, const LocalTensor&) = default;
};

// Whether a model tensor has optimizer state (Adam's exp_avg, exp_avg_sq and
// fp32 master): every parameter does, a buffer (a schema rule with "buffer":
// true, docs/schema_format.md) does not. Everything that lists the optimizer's
// parameters asks this: the optimizer's global tensors and views (ZeRO-1's
// flat buffers included), the layout limits, Megatron's param groups and
// order, its DDP buffer, DCP's optimizer keys, and the saves that bring
// optimizer state.
inline bool HasOptimizerState(const TensorRule& rule) { return !rule.buffer; }
inline bool HasOptimizerState(const GlobalTensor& t) { return !t.buffer; }
inline bool HasOptimizerState(const LocalTensor& t) { return !t.buffer; }

struct RankView {
  int rank = 0;
  RankCoords coords;
  std::vector<LocalTensor> model;  // -> model.safetensors
  std::vector<LocalTensor> optim;  // -> optim.safetensors (empty without optimizer)
  friend bool operator==(const RankView&, const RankView&) = default;
};

// Every global tensor, the model's (parameters and buffers) in schema order
// (layers expanded), then the optimizer state of each parameter (none for a
// buffer).
// \error InvalidArgument naming the rule whose shape formula fails.
Result<std::vector<GlobalTensor>> GlobalTensors(const ModelSpec& spec);

// The shape of `rule`'s tensors under `dims`.
// \error InvalidArgument naming the rule whose shape formula fails, overflows
//   or gives a non-positive size.
Result<Shape> RuleShape(const TensorRule& rule, const ModelDims& dims);

// Checks that `config` partitions the model: pp divides layers (or pp_layers
// sums to layers), tp divides every split dim's units and sizes.
// \error InvalidArgument naming the rule and the numbers, e.g.
//   "tp=3 does not divide rule 'decoder.layers.{i}.self_attention.linear_qkv.weight': kv_heads=8 units".
Status ValidateConfig(const ModelSpec& spec, const ParallelConfig& config);

namespace internal {
// The view of `rank` for a config that ValidateConfig accepted (ModelLayout::View).
Result<RankView> ComputeCheckedView(const ModelSpec& spec, const ParallelConfig& config, int rank);
}  // namespace internal

// What a store keeps of one local tensor: for each global tensor it touches
// (in order of first appearance), the boxes of its segments. A stored shard's
// data is these boxes densely, one after another.
struct ShardKey {
  std::string tensor;
  std::vector<Box> boxes;
  friend bool operator==(const ShardKey&, const ShardKey&) = default;
  friend auto operator<=>(const ShardKey&, const ShardKey&) = default;
};
std::vector<ShardKey> StoredShards(const LocalTensor& local);

// First global layer and layer count of pipeline stage `stage`.
std::pair<Index, Index> StageLayers(const ParallelConfig& config, Index layers, int stage);

}  // namespace ptc
