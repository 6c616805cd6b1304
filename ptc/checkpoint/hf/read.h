// Reading a model that Hugging Face's save_pretrained wrote (config.json,
// model.safetensors or model-0000K-of-0000N.safetensors with
// model.safetensors.index.json) as the first generation of a job
// (docs/hf_format.md, "Importing").
//
// OpenHf checks everything before the store is touched: the config maps to a
// ptcfs model (ptc/checkpoint/hf/hf.h), the index names every tensor once, every
// shard it names exists and holds exactly the tensors the index gives it, and
// every tensor is one the model has, of the shape its config gives. WriteHf
// stores each HF tensor's bytes as one piece (q_proj: the query rows of every
// group of linear_qkv), so nothing is cut or copied twice.
//
// Thread safety: pure functions, and reads of the Env.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/checkpoint/import.h"
#include "ptc/model/box.h"
#include "ptc/model/config.h"
#include "ptc/model/model_layout.h"

namespace ptc::hf {

// Largest config.json and index we read.
inline constexpr uint64_t kMaxJsonSize = 64 << 20;

// A Hugging Face model checked against the ptcfs model its config describes.
struct HfSource {
  ModelLayout layout;     // the model (its tensors' dtype, no optimizer state) in the config asked for
  nlohmann::json config;  // config.json as written, kept in the manifest's extra["hf"]["config"]
  std::vector<std::string> file_names;
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  struct Piece {
    std::string name;    // HF's
    std::string tensor;  // the store's global tensor
    DType dtype = DType::kF32;
    std::vector<Box> boxes;  // of `tensor`, densely one after another in the file
    size_t file = 0;         // index into files
    uint64_t offset = 0;     // of its bytes in the file
    uint64_t size = 0;
  };
  std::vector<Piece> pieces;  // in HF's order
};

// Opens the model in `dir` as a generation in `config`, checking everything
// (above) and writing nothing.
// \error NotFound naming a missing config.json, shard (and a tensor the index
//        puts there) or the absence of both model.safetensors and the index;
//        InvalidArgument naming the file and tensor at fault: JSON that does
//        not parse or names a key twice, a shard name that is not a file name
//        of the directory, a tensor in two shards or in another shard than the
//        index says, a tensor the model lacks (or lm_head.weight of a tied
//        model), a tensor the checkpoint lacks, a shape or dtype that does not
//        fit the config; as ModelOfConfig, MapModel, ReadSafetensorsHeader and
//        ModelLayout::Make.
Result<HfSource> OpenHf(Env* env, const std::string& dir, const ParallelConfig& config);

// Writes `source` into `store` as a new generation, each HF tensor one stored
// piece on the worker of its config's rank 0, with `extra` as the manifest's
// and the config in extra["hf"]["config"].
// \error as the store's writer and the reads of the files.
Result<ImportResult> WriteHf(Store* store, const HfSource& source, nlohmann::json extra,
                             const ProgressFn& progress = {});

// OpenHf, then WriteHf into the store at `store_path` (created when absent;
// its extra kept).
// \error as OpenHf, WriteHf and ImportWith.
Result<ImportResult> ImportHf(Env* env, const std::string& dir, const std::string& store_path,
                              const ParallelConfig& config, const ProgressFn& progress = {});

}  // namespace ptc::hf
