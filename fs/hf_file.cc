#include "fs/hf_file.h"

#include <utility>
#include <vector>

#include "ptc/store/model_spec.h"

namespace ptcfs {
namespace {

std::vector<ptc::LocalTensor> ShardTensors(const ptc::hf::Plan& plan, size_t shard) {
  std::vector<ptc::LocalTensor> out;
  for (size_t t : plan.shards[shard].tensors) out.push_back(plan.model.tensors[t]);
  return out;
}

}  // namespace

ptc::Result<ptc::hf::Plan> PlanHf(const ptc::GenerationManifest& m, uint64_t max_shard_bytes) {
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(m));
  nlohmann::json kept;
  if (m.extra.is_object()) {
    if (auto hf = m.extra.find("hf"); hf != m.extra.end() && hf->is_object()) {
      if (auto c = hf->find("config"); c != hf->end() && c->is_object()) kept = *c;
    }
  }
  return ptc::hf::PlanExport(spec, max_shard_bytes, kept);
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeHfShardFile(const ptc::GenerationReader& reader,
                                                          const ptc::hf::Plan& plan, size_t shard, int prefer_worker) {
  if (shard >= plan.shards.size()) return ptc::InternalError("no HF shard " + std::to_string(shard));
  return MakeSafetensorsFile(reader, ShardTensors(plan, shard), ptc::hf::ShardMetadata(), prefer_worker);
}

ptc::Result<uint64_t> HfShardFileSize(const ptc::hf::Plan& plan, size_t shard) {
  if (shard >= plan.shards.size()) return ptc::InternalError("no HF shard " + std::to_string(shard));
  return SafetensorsFileSize(ShardTensors(plan, shard), ptc::hf::ShardMetadata());
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

}  // namespace ptcfs
