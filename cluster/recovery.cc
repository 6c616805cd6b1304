#include "cluster/recovery.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

namespace ptc::cluster {

std::vector<int> LostWorkers(const ParallelConfig& config, const std::vector<int>& live) {
  std::vector<int> lost;
  for (int w : config.Workers()) {
    if (!std::binary_search(live.begin(), live.end(), w)) lost.push_back(w);
  }
  std::sort(lost.begin(), lost.end());
  return lost;
}

Result<ParallelConfig> SurvivorConfig(const ModelSpec& spec, const ParallelConfig& from, const std::vector<int>& live) {
  const int64_t capacity = static_cast<int64_t>(live.size()) * from.per_worker;
  std::optional<ParallelConfig> best;
  auto better = [&](const ParallelConfig& a, const ParallelConfig& b) {
    if (a.world_size() != b.world_size()) return a.world_size() > b.world_size();
    return std::abs(a.pp - from.pp) < std::abs(b.pp - from.pp);
  };
  for (int pp = 1; pp <= spec.dims.layers && static_cast<int64_t>(from.tp) * pp <= capacity; ++pp) {
    ParallelConfig c;
    c.tp = from.tp;
    c.pp = pp;
    c.dp = static_cast<int>(capacity / (static_cast<int64_t>(from.tp) * pp));
    c.zero = from.zero;
    c.per_worker = from.per_worker;
    if (pp == from.pp) c.pp_layers = from.pp_layers;
    for (; c.dp >= 1; --c.dp) {
      const int slots = c.num_workers();
      c.workers.assign(live.begin(), live.begin() + slots);
      c.replicas = std::min(from.replicas, slots);
      c.DropDefaultPlacement();
      if (ValidateConfig(spec, c).ok()) break;
    }
    if (c.dp >= 1 && (!best || better(c, *best))) best = c;
  }
  if (!best) {
    std::string names;
    for (int w : live) names += (names.empty() ? "" : ", ") + std::to_string(w);
    return FailedPreconditionError("no config with tp=" + std::to_string(from.tp) + " fits the " +
                                   std::to_string(live.size()) + " live workers (" + names + "; per_worker=" +
                                   std::to_string(from.per_worker) + ") that the model allows");
  }
  return *best;
}

}  // namespace ptc::cluster
