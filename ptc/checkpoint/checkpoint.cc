#include "ptc/checkpoint/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ptc/format/npy.h"
#include "ptc/model/limits.h"
#include "ptc/model/tensor_name.h"

namespace ptc {
namespace {

std::vector<TensorSpec> Specs(const std::vector<LocalTensor>& tensors) {
  std::vector<TensorSpec> out;
  for (const LocalTensor& t : tensors) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimFile[] = "optim.safetensors";
constexpr char kTensorsDir[] = "tensors";

Status WriteFile(OutputDir& dir, const std::string& name, const ParallelConfig& config, const RankView& view,
                 const std::vector<LocalTensor>& tensors, const FillFn& fill, const ProgressFn& progress) {
  const std::string path = JoinPath(dir.path(), name);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"ptcfs.rank", std::to_string(view.rank)}, {"ptcfs.config", config.ToString()}};
  PTC_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(dir, name, Specs(tensors), metadata));
  std::vector<unsigned char> buf;
  for (const LocalTensor& t : tensors) {
    const size_t nbytes = NumElements(t.shape) * DTypeSize(t.dtype);
    buf.assign(nbytes, 0);
    PTC_RETURN_IF_ERROR(fill(t, buf.data()), path + ": tensor '" + t.name + "'");
    PTC_RETURN_IF_ERROR(writer->Append(buf.data(), nbytes), path);
    if (progress) progress(nbytes);
  }
  return writer->Finish();
}

// tensors/<name>.npy for each local tensor, and tensors/dtypes.json.
Status WriteNpyFiles(OutputDir& dir, const std::vector<LocalTensor>& tensors, const FillFn& fill,
                     const ProgressFn& progress, std::map<std::string, DType>* dtypes) {
  std::vector<unsigned char> buf;
  for (const LocalTensor& t : tensors) {
    const std::string file = t.name + ".npy", path = JoinPath(dir.path(), file);
    PTC_RETURN_IF_ERROR(ValidateTensorName(t.name, dir.path()));
    PTC_RETURN_IF_ERROR(ValidateLeafName(dir.path(), file));  // nothing may be created outside `dir`
    const size_t nbytes = NumElements(t.shape) * DTypeSize(t.dtype);
    buf.assign(nbytes, 0);
    PTC_RETURN_IF_ERROR(fill(t, buf.data()), path);
    PTC_ASSIGN_OR_RETURN(auto writer, NpyWriter::Create(dir, file, t.dtype, t.shape));
    PTC_RETURN_IF_ERROR(writer->Append(buf.data(), nbytes), path);
    PTC_RETURN_IF_ERROR(writer->Finish(), path);
    (*dtypes)[file] = t.dtype;
    if (progress) progress(nbytes);
  }
  return Status::OK();
}

// The file's tensors by name, once each matches `expected`.
Result<std::unordered_map<std::string_view, const SafetensorsEntry*>> CheckFile(
    const std::string& path, const SafetensorsHeader& header, const std::vector<LocalTensor>& expected) {
  std::unordered_map<std::string_view, const SafetensorsEntry*> by_name;  // a rank may hold 100,000 tensors
  for (const SafetensorsEntry& e : header.tensors) {
    PTC_RETURN_IF_ERROR(ValidateTensorName(e.name, path));
    by_name.emplace(e.name, &e);
  }
  std::unordered_set<std::string_view> names;
  for (const LocalTensor& t : expected) {
    names.insert(t.name);
    auto found = by_name.find(t.name);
    if (found == by_name.end()) return InvalidArgumentError(path + ": missing tensor '" + t.name + "'");
    const SafetensorsEntry* e = found->second;
    if (e->dtype != t.dtype) {
      return InvalidArgumentError(path + ": tensor '" + t.name + "' has dtype " + std::string(DTypeName(e->dtype)) +
                                  ", expected " + std::string(DTypeName(t.dtype)));
    }
    if (e->shape != t.shape) {
      return InvalidArgumentError(path + ": tensor '" + t.name + "' has shape " + ShapeToString(e->shape) +
                                  ", expected " + ShapeToString(t.shape) + " for this rank");
    }
  }
  for (const SafetensorsEntry& e : header.tensors) {
    if (!names.count(e.name)) {
      return InvalidArgumentError(path + ": unknown tensor '" + e.name + "' (not in this rank's view of the schema)");
    }
  }
  return by_name;
}

}  // namespace

std::string RankDirName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d", rank);
  return buf;
}

std::string ModelFilePath(const std::string& dir, int rank) {
  return JoinPath(JoinPath(dir, RankDirName(rank)), kModelFile);
}

std::string OptimFilePath(const std::string& dir, int rank) {
  return JoinPath(JoinPath(dir, RankDirName(rank)), kOptimFile);
}

Result<CheckpointFormat> ParseCheckpointFormat(std::string_view name) {
  if (name == "safetensors") return CheckpointFormat::kSafetensors;
  if (name == "npy") return CheckpointFormat::kNpy;
  return InvalidArgumentError("format '" + std::string(name) + "' is not one of safetensors, npy");
}

Status CheckCheckpointWrite(Env* env, const ModelLayout& layout, CheckpointFormat format, const std::string& what) {
  uint64_t files = 0, largest = 0;
  std::string largest_name;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(rank));
    const uint64_t tensors = view.model.size() + view.optim.size();
    // The rank's directory, then model (+ optim) or tensors/ with a file per tensor and dtypes.json.
    files += 1 + (format == CheckpointFormat::kNpy ? 2 + tensors : view.optim.empty() ? 1 : 2);
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) {
        const uint64_t bytes = static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
        if (bytes > largest) largest = bytes, largest_name = t.name;
      }
    }
  }
  PTC_RETURN_IF_ERROR(CheckFilesWritten(files, what));
  return CheckHeldBytes(largest, env->MemoryBytes(), what + ": tensor '" + largest_name + "'");
}

Status WriteRankCheckpoint(Env* env, const std::string& dir, const ParallelConfig& config, const RankView& view,
                           const FillFn& fill, const ProgressFn& progress, CheckpointFormat format) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, env->OpenOutputDir(dir));
  return WriteRankCheckpoint(*out, config, view, fill, progress, format);
}

Status WriteRankCheckpoint(OutputDir& out, const ParallelConfig& config, const RankView& view, const FillFn& fill,
                           const ProgressFn& progress, CheckpointFormat format) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> rank, out.CreateDir(RankDirName(view.rank)));
  if (format == CheckpointFormat::kNpy) {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> tensors, rank->CreateDir(kTensorsDir));
    std::map<std::string, DType> dtypes;
    PTC_RETURN_IF_ERROR(WriteNpyFiles(*tensors, view.model, fill, progress, &dtypes));
    PTC_RETURN_IF_ERROR(WriteNpyFiles(*tensors, view.optim, fill, progress, &dtypes));
    PTC_ASSIGN_OR_RETURN(std::string json, EncodeNpyDTypes(dtypes));
    return WriteFileAtomic(*tensors, std::string(kNpyDTypesFile), json);
  }
  PTC_RETURN_IF_ERROR(WriteFile(*rank, kModelFile, config, view, view.model, fill, progress));
  if (view.optim.empty()) return Status::OK();
  return WriteFile(*rank, kOptimFile, config, view, view.optim, fill, progress);
}

Result<std::unique_ptr<RankCheckpoint>> RankCheckpoint::Open(Env* env, const std::string& dir, const RankView& view) {
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  std::map<std::string, Location> where;
  auto open = [&](const std::string& path, const std::vector<LocalTensor>& expected) -> Status {
    if (!env->Exists(path)) {
      return NotFoundError(path + ": missing (rank " + std::to_string(view.rank) + " of the config has no file)");
    }
    PTC_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(env, path));
    PTC_ASSIGN_OR_RETURN(auto by_name, CheckFile(path, header, expected));
    PTC_ASSIGN_OR_RETURN(files.emplace_back(), env->OpenRead(path));
    for (const LocalTensor& t : expected) where[t.name] = {files.back().get(), by_name.at(t.name)->offset};
    return Status::OK();
  };
  PTC_RETURN_IF_ERROR(open(ModelFilePath(dir, view.rank), view.model));
  const std::string optim = OptimFilePath(dir, view.rank);
  if (!view.optim.empty()) {
    PTC_RETURN_IF_ERROR(open(optim, view.optim));
  } else if (env->Exists(optim)) {
    return InvalidArgumentError(optim + ": optimizer state present, but rank 0 has none");
  }
  return std::make_unique<RankCheckpoint>(std::move(files), std::move(where));
}

FileTensor RankCheckpoint::Locate(const LocalTensor& tensor, const Segment& segment) const {
  const Location& at = where_.at(tensor.name);
  return FileTensor{at.file, at.offset, segment.box, segment.layout, DTypeSize(tensor.dtype)};
}

Result<ModelSpec> InferModelSpec(Env* env, const std::string& dir, const Schema& schema, const ModelDims& dims) {
  const std::string path = ModelFilePath(dir, 0);
  if (!env->Exists(path)) return NotFoundError(path + ": missing (every checkpoint has rank 0)");
  PTC_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(env, path));
  if (header.tensors.empty()) return InvalidArgumentError(path + ": holds no tensor");
  // The dtype most of rank 0's parameters have: a single tensor of another
  // dtype is then blamed by name (CheckFile), not every other tensor.
  std::map<DType, size_t> votes;
  for (const SafetensorsEntry& e : header.tensors) votes[e.dtype]++;
  DType dtype = header.tensors.front().dtype;
  for (const auto& [d, n] : votes) {
    if (n > votes[dtype]) dtype = d;
  }
  ModelSpec spec{schema, dims, dtype, env->Exists(OptimFilePath(dir, 0))};
  return spec;
}

}  // namespace ptc
