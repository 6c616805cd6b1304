#include "view/export.h"

#include "ptc/store/model_spec.h"
#include "ptc/store/store_reader.h"
#include "view/dcp_file.h"
#include "view/hf_file.h"
#include "view/megatron_file.h"

namespace ptcfs {
namespace {

ptc::Status ExportRanks(const ptc::Store& store, const ptc::ModelLayout& layout, const std::string& out_dir,
                        ptc::CheckpointFormat format, const ptc::ProgressFn& progress) {
  const ptc::ParallelConfig& config = layout.config();
  ptc::GenerationReader reader(store, store.CurrentSnapshot(), /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> out, store.env()->OpenOutputDir(out_dir));
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, layout.View(rank));
    const int worker = config.WorkerOf(rank);
    auto fill = [&](const ptc::LocalTensor& t, void* buffer) -> ptc::Status {
      for (const ptc::Segment& s : t.segments) {
        PTC_RETURN_IF_ERROR(reader.Read(s.tensor, s.box, buffer, s.box, s.layout, worker));
      }
      return ptc::Status::OK();
    };
    PTC_RETURN_IF_ERROR(ptc::WriteRankCheckpoint(*out, config, view, fill, progress, format));
  }
  return ptc::Status::OK();
}

}  // namespace

ptc::Status ExportCheckpoint(const ptc::Store& store, const ptc::ParallelConfig& config, const std::string& out_dir,
                             ptc::CheckpointFormat format, const ptc::ProgressFn& progress) {
  if (!store.has_generation()) {
    return ptc::FailedPreconditionError(store.root() + ": the store holds no generation yet");
  }
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(store.current()));
  PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), config));
  return ExportCheckpoint(store, layout, out_dir, format, progress);
}

ptc::Status ExportCheckpoint(const ptc::Store& store, const ptc::ModelLayout& layout, const std::string& out_dir,
                             ptc::CheckpointFormat format, const ptc::ProgressFn& progress) {
  ptc::Env* env = store.env();
  if (!store.has_generation()) {
    return ptc::FailedPreconditionError(store.root() + ": the store holds no generation yet");
  }
  PTC_RETURN_IF_ERROR(ptc::CheckCheckpointWrite(env, layout, format, out_dir));
  return WriteFreshDirectory(env, out_dir, [&] { return ExportRanks(store, layout, out_dir, format, progress); });
}

ptc::Status ExportMegatron(ptc::Env* env, const ptc::Store& store,
                           std::shared_ptr<const ptc::GenerationManifest> generation, const ptc::ModelLayout& layout,
                           const std::string& out_dir, ptc::megatron::NameSet names, const ptc::ProgressFn& progress) {
  const ptc::ParallelConfig& config = layout.config();
  const std::string manifest = store.ManifestPath(generation->generation);
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state,
                       ptc::megatron::LoadMegatronState(generation->extra, manifest));
  ptc::GenerationReader reader(store, generation, /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(const std::vector<ptc::RankView> views, MegatronTreeViews(layout));
  // Every directory and file made in its parent, never through a link (ptc::OutputDir).
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> out, env->OpenOutputDir(out_dir));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> iter_dir,
                       out->CreateDir(ptc::megatron::IterationDirName(state.iteration)));
  for (const ptc::RankView& view : views) {
    PTC_ASSIGN_OR_RETURN(MegatronFilePlan plan, PlanMegatronFile(layout.spec(), config, view, state, names));
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> dir, iter_dir->CreateDir(MegatronRankDir(view, config)));
    PTC_RETURN_IF_ERROR(WriteMegatronFile(reader, plan, *dir, progress));
  }
  return ptc::WriteFileAtomic(*out, std::string(ptc::megatron::kLatestFile), std::to_string(state.iteration));
}

ptc::Status ExportDcp(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                      const std::string& out_dir, const ptc::ProgressFn& progress, ptc::dcp::Keys keys) {
  PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(*generation, keys));
  ptc::GenerationReader reader(store, generation, /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> out, env->OpenOutputDir(out_dir));
  for (size_t i = 0; i < plan.files.size(); ++i) {
    const std::string path = ptc::JoinPath(out->path(), plan.files[i].name);
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<VirtualFile> file, MakeDcpFile(reader, plan, i, -1));
    PTC_ASSIGN_OR_RETURN(auto dst, out->NewWritableFile(plan.files[i].name));
    PTC_RETURN_IF_ERROR(WriteVirtualFile(*file, *dst, path, progress));
    PTC_RETURN_IF_ERROR(dst->Close(), path);
  }
  // .metadata last: a directory without it is no checkpoint.
  return ptc::WriteFileAtomic(*out, ptc::dcp::kMetadataFile, ptc::dcp::EncodeMetadata(plan));
}

ptc::Status ExportHf(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                     const std::string& out_dir, uint64_t max_shard_bytes, const ptc::ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(ptc::hf::Plan plan, PlanHf(*generation, max_shard_bytes));
  ptc::GenerationReader reader(store, generation, /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> out, env->OpenOutputDir(out_dir));
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const std::string& name = plan.shards[i].file;
    const std::string path = ptc::JoinPath(out->path(), name);
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<VirtualFile> file, MakeHfShardFile(reader, plan, i, -1), path);
    PTC_ASSIGN_OR_RETURN(auto dst, out->NewWritableFile(name));
    PTC_RETURN_IF_ERROR(WriteVirtualFile(*file, *dst, path, progress));
    PTC_RETURN_IF_ERROR(dst->Close(), path);
  }
  // config.json and the index last: a directory without them is no model.
  if (!plan.index_json.empty()) {
    PTC_RETURN_IF_ERROR(ptc::WriteFileAtomic(*out, ptc::hf::kIndexFile, plan.index_json));
  }
  return ptc::WriteFileAtomic(*out, ptc::hf::kConfigFile, plan.config_json);
}

ptc::Status WriteFreshDirectory(ptc::Env* env, const std::string& out_dir, const std::function<ptc::Status()>& write) {
  const bool existed = env->Exists(out_dir);
  if (existed) {
    PTC_ASSIGN_OR_RETURN(auto names, env->ListDir(out_dir));
    if (!names.empty()) {
      return ptc::InvalidArgumentError(out_dir + ": exists and is not empty (export writes a fresh directory)");
    }
  }
  ptc::Status s = write();
  if (!s.ok()) (void)env->RemoveTree(out_dir);
  if (!s.ok() && existed) (void)env->CreateDirs(out_dir);
  return s;
}

}  // namespace ptcfs
