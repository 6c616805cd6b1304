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

namespace {

// The expert-parallel degrees to try for a survivor config, nearest to
// `from` first (the fewest experts moved), the smaller of a tie first.
std::vector<int> EpCandidates(const ModelSpec& spec, int from) {
  std::vector<int> eps;
  const int64_t experts = std::max<int64_t>(spec.dims.experts, 1);
  for (int ep = 1; ep <= experts; ++ep) {
    if (experts % ep == 0) eps.push_back(ep);
  }
  std::stable_sort(eps.begin(), eps.end(), [from](int a, int b) { return std::abs(a - from) < std::abs(b - from); });
  return eps;
}

// The largest data-parallel degree (and with it an ep, nearest from's) that
// makes `c` (tp, cp, etp and pp set) a config the model allows on `live`,
// or nullopt.
std::optional<ParallelConfig> FitDp(const ModelSpec& spec, const ParallelConfig& from, ParallelConfig c,
                                    const std::vector<int>& live, int64_t capacity) {
  const std::vector<int> eps = EpCandidates(spec, from.ep);
  for (c.dp = static_cast<int>(capacity / (static_cast<int64_t>(c.tp) * c.cp * c.pp)); c.dp >= 1; --c.dp) {
    const int slots = c.num_workers();
    c.workers.assign(live.begin(), live.begin() + slots);
    c.replicas = std::min(from.replicas, slots);
    c.DropDefaultPlacement();
    for (int ep : eps) {
      c.ep = ep;
      if (ValidateConfig(spec, c).ok()) return c;
    }
  }
  return std::nullopt;
}

}  // namespace

Result<ParallelConfig> SurvivorConfig(const ModelSpec& spec, const ParallelConfig& from, const std::vector<int>& live) {
  const int64_t capacity = static_cast<int64_t>(live.size()) * from.per_worker;
  std::optional<ParallelConfig> best;
  auto better = [&](const ParallelConfig& a, const ParallelConfig& b) {
    if (a.world_size() != b.world_size()) return a.world_size() > b.world_size();
    if (a.pp != b.pp) return std::abs(a.pp - from.pp) < std::abs(b.pp - from.pp);
    return std::abs(a.ep - from.ep) < std::abs(b.ep - from.ep);
  };
  const int64_t unit = static_cast<int64_t>(from.tp) * from.cp;  // the ranks of one (dp, pp) coordinate
  for (int pp = 1; pp <= spec.dims.layers && unit * pp <= capacity; ++pp) {
    ParallelConfig c;
    c.tp = from.tp;
    c.cp = from.cp;
    c.etp = from.etp;
    c.pp = pp;
    c.zero = from.zero;
    c.per_worker = from.per_worker;
    if (pp == from.pp) c.pp_layers = from.pp_layers;
    std::optional<ParallelConfig> fit = FitDp(spec, from, std::move(c), live, capacity);
    if (fit && (!best || better(*fit, *best))) best = std::move(fit);
  }
  if (!best) {
    std::string names;
    for (int w : live) names += (names.empty() ? "" : ", ") + std::to_string(w);
    std::string kept = "tp=" + std::to_string(from.tp);
    if (from.cp > 1) kept += ",cp=" + std::to_string(from.cp);
    if (from.etp) kept += ",etp=" + std::to_string(from.etp);
    return FailedPreconditionError("no config with " + kept + " fits the " + std::to_string(live.size()) +
                                   " live workers (" + names + "; per_worker=" + std::to_string(from.per_worker) +
                                   ") that the model allows");
  }
  return *best;
}

}  // namespace ptc::cluster
