#include "ptc/checkpoint/export.h"

#include "ptc/store/model_spec.h"
#include "ptc/store/store_reader.h"

namespace ptc {
namespace {

Status ExportRanks(const Store& store, const ModelLayout& layout, const std::string& out_dir, CheckpointFormat format,
                   const ProgressFn& progress) {
  const ParallelConfig& config = layout.config();
  GenerationReader reader(store, store.CurrentSnapshot(), /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, store.env()->OpenOutputDir(out_dir));
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(rank));
    const int worker = config.WorkerOf(rank);
    auto fill = [&](const LocalTensor& t, void* buffer) -> Status {
      for (const Segment& s : t.segments) {
        PTC_RETURN_IF_ERROR(reader.Read(s.tensor, s.box, buffer, s.box, s.layout, worker));
      }
      return Status::OK();
    };
    PTC_RETURN_IF_ERROR(WriteRankCheckpoint(*out, config, view, fill, progress, format));
  }
  return Status::OK();
}

}  // namespace

Status ExportCheckpoint(const Store& store, const ParallelConfig& config, const std::string& out_dir,
                        CheckpointFormat format, const ProgressFn& progress) {
  if (!store.has_generation()) return FailedPreconditionError(store.root() + ": the store holds no generation yet");
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromManifest(store.current()));
  PTC_ASSIGN_OR_RETURN(ModelLayout layout, ModelLayout::Make(std::move(spec), config));
  return ExportCheckpoint(store, layout, out_dir, format, progress);
}

Status ExportCheckpoint(const Store& store, const ModelLayout& layout, const std::string& out_dir,
                        CheckpointFormat format, const ProgressFn& progress) {
  Env* env = store.env();
  if (!store.has_generation()) return FailedPreconditionError(store.root() + ": the store holds no generation yet");
  PTC_RETURN_IF_ERROR(CheckCheckpointWrite(env, layout, format, out_dir));
  return WriteFreshDirectory(env, out_dir, [&] { return ExportRanks(store, layout, out_dir, format, progress); });
}

Status WriteFreshDirectory(Env* env, const std::string& out_dir, const std::function<Status()>& write) {
  const bool existed = env->Exists(out_dir);
  if (existed) {
    PTC_ASSIGN_OR_RETURN(auto names, env->ListDir(out_dir));
    if (!names.empty())
      return InvalidArgumentError(out_dir + ": exists and is not empty (export writes a fresh directory)");
  }
  Status s = write();
  if (!s.ok()) (void)env->RemoveTree(out_dir);
  if (!s.ok() && existed) (void)env->CreateDirs(out_dir);
  return s;
}

}  // namespace ptc
