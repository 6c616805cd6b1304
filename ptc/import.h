// `ptcfs import`: a per-rank safetensors checkpoint into a store.
//
// All rank files are checked against their views before the store is
// touched; every replica (dp copies, tp-replicated tensors, tied embeddings)
// must agree by checksum; tensors replicated across the ranks of one worker
// are stored once on that worker. The result is committed as a new
// generation; on any failure the store is as it was (a store this call
// created is removed again).
#pragma once

#include <string>

#include "ptc/checkpoint.h"
#include "ptc/env.h"

namespace ptc {

struct ImportResult {
  uint64_t generation = 0;
  uint64_t shards = 0;
  uint64_t bytes_stored = 0;
  uint64_t bytes_read = 0;
};

// \error as InferModelSpec, ValidateConfig and RankCheckpoint::Open (missing
//        rank file, wrong shape or dtype, unknown tensor, malformed header).
// \error InvalidArgument when replicas of a tensor disagree, naming the tensor,
//        its boxes and both ranks.
// \error as Store::Create / Store::Open and the GenerationWriter.
Result<ImportResult> ImportCheckpoint(Env* env, const std::string& src_dir, const std::string& store_path,
                                      const Schema& schema, const ModelDims& dims, const ParallelConfig& config,
                                      const ProgressFn& progress = {});

}  // namespace ptc
