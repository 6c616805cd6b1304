// Per-rank checkpoint directories in safetensors format:
//
//   DIR/rank-00003/model.safetensors    the rank's parameters, by local name
//   DIR/rank-00003/optim.safetensors    its optimizer state, when there is any
//
// This is what `ptcfs synth` and `ptcfs export` write and `ptcfs import`
// and `ptcfs diff` read. A reader checks the files against the rank's view:
// every expected tensor present with the expected dtype and shape, nothing
// else.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/format/safetensors.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/region_io.h"
#include "ptc/model/view.h"

namespace ptc {

std::string RankDirName(int rank);  // "rank-00003"
std::string ModelFilePath(const std::string& dir, int rank);
std::string OptimFilePath(const std::string& dir, int rank);

// Reports bytes as they are done (to drive a progress bar); may be empty.
using ProgressFn = std::function<void(uint64_t bytes)>;

// Fills the bytes of one local tensor; the buffer is zeroed beforehand
// (ZeRO padding stays zero).
using FillFn = std::function<Status(const LocalTensor& tensor, void* buffer)>;

enum class CheckpointFormat {
  kSafetensors,  // rank-RRRRR/model.safetensors (+ optim.safetensors)
  kNpy,          // rank-RRRRR/tensors/<local name>.npy + tensors/dtypes.json
};
// "safetensors" | "npy".
// \error InvalidArgument for anything else.
Result<CheckpointFormat> ParseCheckpointFormat(std::string_view name);

// Checks, before anything is written, that writing every rank of `layout` in
// `format` stays within the limits (ptc/model/limits.h): the files made
// (kMaxFilesWritten) and the largest local tensor, held in memory while it is
// written, against env->MemoryBytes(). `what` starts the messages.
// \error InvalidArgument naming the limit and the value; as ModelLayout::View.
Status CheckCheckpointWrite(Env* env, const ModelLayout& layout, CheckpointFormat format, const std::string& what);

// Writes one rank's files in `format`, one local tensor in memory at a time.
// \error as SafetensorsWriter / NpyWriter and `fill`; the message names the file.
// \error InvalidArgument when a tensor name would make a file outside the
//        rank's directory (ValidateTensorName, ValidateLeafName).
// Every directory and file is made in its parent directory (Env::OpenOutputDir
// for `dir`, then OutputDir), new, never through a symbolic link:
// \error PermissionDenied naming the link; AlreadyExists naming a file that exists.
Status WriteRankCheckpoint(Env* env, const std::string& dir, const ParallelConfig& config, const RankView& view,
                           const FillFn& fill, const ProgressFn& progress = {},
                           CheckpointFormat format = CheckpointFormat::kSafetensors);
// The same in an output directory already open (an export of many ranks).
Status WriteRankCheckpoint(OutputDir& out, const ParallelConfig& config, const RankView& view, const FillFn& fill,
                           const ProgressFn& progress = {}, CheckpointFormat format = CheckpointFormat::kSafetensors);

// The files of one rank, checked against its view: where each local tensor's
// elements lie (row-major, contiguous) in which file.
class RankCheckpoint {
 public:
  // rank-RRRRR/model.safetensors (+ optim.safetensors) under `dir`.
  // \error NotFound naming the missing file.
  // \error InvalidArgument naming the file and tensor: a tensor of the view is
  //        missing, has another dtype or shape, or the file holds a tensor the
  //        view does not know, or a name fails ValidateTensorName; malformed
  //        safetensors headers as ParseSafetensorsHeader.
  static Result<std::unique_ptr<RankCheckpoint>> Open(Env* env, const std::string& dir, const RankView& view);

  struct Location {
    const RandomAccessFile* file;  // one of `files`
    uint64_t offset;               // of the tensor's first element
  };
  // A rank of any file format: `where` maps every local tensor name of the
  // view to its bytes, which the caller has checked.
  RankCheckpoint(std::vector<std::unique_ptr<RandomAccessFile>> files, std::map<std::string, Location> where)
      : files_(std::move(files)), where_(std::move(where)) {}

  // Where the elements of `segment` of `tensor` (a local tensor of the view)
  // lie in its file.
  FileTensor Locate(const LocalTensor& tensor, const Segment& segment) const;

 private:
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::map<std::string, Location> where_;
};

// The model a checkpoint directory holds: the given schema and dims, the
// parameters' dtype read from rank 0, optimizer state when rank 0 has
// optim.safetensors.
// \error NotFound when rank-00000/model.safetensors is missing; as
//        ReadSafetensorsHeader; InvalidArgument when it holds no tensor.
Result<ModelSpec> InferModelSpec(Env* env, const std::string& dir, const Schema& schema, const ModelDims& dims);

}  // namespace ptc
