#include "fs/snapshot.h"

namespace ptcfs {

Snapshot::Snapshot(const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                   const ptc::ModelSpec& spec, const ptc::ParallelConfig& config)
    : store_(store), generation_(generation), spec_(spec), config_(config),
      reader_(store, generation, /*verify=*/false) {}

ptc::Result<std::shared_ptr<const Snapshot>> Snapshot::Create(
    const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation, const ptc::ModelSpec& spec,
    const ptc::ParallelConfig& config, int worker) {
  PTC_RETURN_IF_ERROR(ptc::ValidateConfig(spec, config));
  if (worker >= config.num_workers()) {
    return ptc::InvalidArgumentError("worker " + std::to_string(worker) + " does not exist in config " +
                                     config.ToString() + " (" + std::to_string(config.num_workers()) + " workers)");
  }
  std::shared_ptr<Snapshot> s(new Snapshot(store, std::move(generation), spec, config));
  for (int rank = 0; rank < config.world_size(); ++rank) {
    if (worker >= 0 && config.WorkerOf(rank) != worker) continue;
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, ptc::ComputeView(spec, config, rank));
    s->views_.push_back(std::move(view));
  }
  return std::shared_ptr<const Snapshot>(std::move(s));
}

std::map<std::string, std::string> Snapshot::Metadata(int rank) const {
  return {{"format", "pt"}, {"ptcfs.rank", std::to_string(rank)}, {"ptcfs.config", config_.ToString()}};
}

ptc::Status Snapshot::Check(const ptc::ShardRecord& shard) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = checked_.find(&shard); it != checked_.end()) return it->second;
  }
  ptc::Status s = ptc::VerifyShard(store_.env(), store_, shard);
  std::lock_guard<std::mutex> lock(mu_);
  return checked_.emplace(&shard, s).first->second;
}

}  // namespace ptcfs
