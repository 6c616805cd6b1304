// `ptcfs diff`: do two per-rank checkpoints (possibly of different parallel
// configs) describe bit-identical global tensors?
//
// Each global tensor is assembled from every rank that holds part of it; all
// replicas inside one checkpoint must agree, then the two assemblies must be
// equal. Memory: one global tensor of each side at a time.
#pragma once

#include <optional>
#include <string>

#include "ptc/checkpoint/checkpoint.h"

namespace ptc {

struct CheckpointSide {
  std::string dir;
  ParallelConfig config;
};

struct DiffResult {
  bool equal = true;
  std::string tensor;        // the first differing global tensor
  std::vector<Index> index;  // its first differing element
  std::string reason;        // one line for humans, e.g. "A and B differ at [3, 7]: 0x3f80 vs 0x3f81"
};

// Compares global tensors of both checkpoints (schema and dims shared, dtype
// and optimizer state read from each). A difference is a result, not an error.
// \error as InferModelSpec, ModelLayout::Make and RankCheckpoint::Open for either side.
Result<DiffResult> DiffCheckpoints(Env* env, const Schema& schema, const ModelDims& dims, const CheckpointSide& a,
                                   const CheckpointSide& b, const ProgressFn& progress = {});

}  // namespace ptc
