#include "view/hf_file.h"

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

}  // namespace ptcfs
