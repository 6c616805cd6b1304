#include "ptc/model/model_layout.h"

#include <string>
#include <utility>

namespace ptc {

Result<ModelLayout> ModelLayout::Make(ModelSpec spec, ParallelConfig config) {
  PTC_RETURN_IF_ERROR(ValidateConfig(spec, config));
  auto shared = std::make_shared<Shared>();
  shared->spec = std::move(spec);
  shared->config = std::move(config);
  return ModelLayout(std::move(shared));
}

Result<RankView> ModelLayout::View(int rank) const {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<const RankView> body, Body(rank));
  RankView view = *body;
  view.rank = rank;
  view.coords = shared_->config.CoordsOf(rank);
  return view;
}

Result<std::shared_ptr<const RankView>> ModelLayout::Body(int rank, bool keep) const {
  const ParallelConfig& config = shared_->config;
  if (rank < 0 || rank >= config.world_size()) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is outside world size " +
                                std::to_string(config.world_size()) + " of config " + config.ToString());
  }
  const RankCoords coords = config.CoordsOf(rank);
  const BodyKey key{coords.tp,
                    coords.pp,
                    coords.etp,
                    coords.ep,
                    config.zero ? ParallelConfig::DenseZeroIndex(coords, config.cp) : 0,
                    config.zero ? coords.edp : 0};
  std::shared_ptr<const RankView> body;
  {
    MutexLock lock(&shared_->mu);
    auto it = shared_->bodies.find(key);
    if (it != shared_->bodies.end()) body = it->second;
  }
  if (body == nullptr) {
    // Computed outside the lock (two threads may both compute one body; the
    // first kept wins, and both are equal).
    PTC_ASSIGN_OR_RETURN(RankView computed, internal::ComputeCheckedView(shared_->spec, config, rank));
    if (!keep) return std::make_shared<const RankView>(std::move(computed));
    MutexLock lock(&shared_->mu);
    body = shared_->bodies.try_emplace(key, std::make_shared<const RankView>(std::move(computed))).first->second;
  }
  return body;
}

}  // namespace ptc
