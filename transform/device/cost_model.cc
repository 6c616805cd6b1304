#include "transform/device/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "transform/device/switch_plan.h"

namespace ptc::transform::device {

Result<ModelStats> StatsOf(const ModelSpec& spec) {
  ModelSpec s = spec;
  s.optimizer = false;
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(s));
  ModelStats m;
  for (const GlobalTensor& g : globals) m.params += static_cast<double>(NumElements(g.shape));
  m.layers = static_cast<double>(spec.dims.layers);
  m.hidden = static_cast<double>(spec.dims.hidden);
  m.vocab = static_cast<double>(spec.dims.vocab);
  return m;
}

Estimate EstimateBucket(const ModelStats& m, const Hardware& hw, const ParallelConfig& c, const LengthBucket& b) {
  Estimate e;
  const double n = hw.gpus, tp = c.tp, pp = c.pp, dp = c.dp;
  const double per_replica = std::ceil(b.sequences / dp);  // micro-batches of one sequence each
  const double in_flight = std::max(1.0, std::min(per_replica, pp));
  const double s = static_cast<double>(b.max_len);
  e.memory_bytes = 4 * m.params / (tp * pp) + 12 * m.params / n + 34 * s * m.hidden * m.layers / tp * in_flight / pp +
                   4 * s * m.vocab / tp;
  e.fits = e.memory_bytes <= (1 - hw.reserve) * hw.memory_bytes;
  if (b.sequences <= 0) return e;
  // One sequence of mean length on one replica: compute spread over tp*pp GPUs, tp traffic per stage.
  const double flops = 6 * m.params * b.mean_len + 6 * m.layers * m.hidden * b.mean_sq_len;
  const double compute = flops / (tp * pp * hw.peak_flops * hw.mfu);
  // Per stage: 4 all-reduces per layer (2 forward, 2 backward), each moving 2 (tp-1)/tp of s h bf16 values.
  const double tp_comm =
      tp > 1 ? m.layers / pp * 4 * (2 * b.mean_len * m.hidden * 2 * (tp - 1) / tp / hw.link_bytes_per_s +
                                    hw.collective_latency_s)
             : 0;
  const double stage = compute + tp_comm;  // per micro-batch per stage
  e.seconds = (per_replica + pp - 1) * stage;
  return e;
}

std::vector<ParallelConfig> CandidateConfigs(const ModelSpec& spec, const Hardware& hw) {
  std::vector<ParallelConfig> out;
  for (int tp = 1; tp <= std::min(hw.gpus, hw.gpus_per_node); ++tp) {
    if (hw.gpus % tp != 0) continue;
    for (int pp = 1; pp * tp <= hw.gpus; ++pp) {
      if ((hw.gpus / tp) % pp != 0) continue;
      ParallelConfig c;
      c.tp = tp;
      c.pp = pp;
      c.dp = hw.gpus / (tp * pp);
      c.per_worker = hw.gpus_per_node;
      if (ValidateConfig(spec, c).ok()) out.push_back(c);
    }
  }
  return out;
}

std::vector<LengthBucket> UniformBuckets(const std::vector<uint64_t>& bounds, const std::vector<double>& shares,
                                         double global_batch) {
  std::vector<LengthBucket> out;
  double lo = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    const double hi = static_cast<double>(bounds[i]);
    LengthBucket b;
    b.max_len = bounds[i];
    b.sequences = global_batch * (i < shares.size() ? shares[i] : 0);
    b.mean_len = (lo + 1 + hi) / 2;
    b.mean_sq_len = ((lo + 1) * (lo + 1) + (lo + 1) * hi + hi * hi) / 3;
    out.push_back(b);
    lo = hi;
  }
  return out;
}

namespace {

std::string Key(const ParallelConfig& c) { return c.ToString(); }

// Switch costs between layouts, planned once each (parameters and gradients in bf16).
class SwitchCosts {
 public:
  SwitchCosts(const ModelSpec& spec, const Hardware& hw) : spec_(spec), hw_(hw) {}
  Result<SwitchStep> Get(const ParallelConfig& a, const ParallelConfig& b) {
    SwitchStep step{a, b, 0, 0};
    if (a == b) return step;
    const auto key = std::make_pair(Key(a), Key(b));
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    SwitchRequest req;
    req.spec = spec_;
    req.from = a;
    req.to = b;
    req.ranks_per_host = hw_.gpus_per_node;
    req.budget_bytes = 1ull << 30;
    PTC_ASSIGN_OR_RETURN(SwitchPlan plan, MakeSwitchPlan(req));
    step.bytes = plan.bottleneck;
    step.seconds = static_cast<double>(plan.bottleneck) / hw_.link_bytes_per_s + hw_.switch_latency_s;
    cache_.emplace(key, step);
    return step;
  }

 private:
  const ModelSpec& spec_;
  const Hardware& hw_;
  std::map<std::pair<std::string, std::string>, SwitchStep> cache_;
};

}  // namespace

Result<StrategyReport> PlanStrategies(const ModelSpec& spec, const Hardware& hw, const std::vector<LengthBucket>& buckets,
                                      const ParallelConfig* fixed) {
  if (buckets.empty()) return InvalidArgumentError("strategies: no length buckets");
  PTC_ASSIGN_OR_RETURN(ModelStats m, StatsOf(spec));
  const std::vector<ParallelConfig> configs = CandidateConfigs(spec, hw);
  if (configs.empty()) {
    return InvalidArgumentError("strategies: no (dp, tp, pp) of " + std::to_string(hw.gpus) + " GPUs partitions the model");
  }
  StrategyReport r;
  // Per bucket: the fastest config that holds its longest sequence.
  for (const LengthBucket& b : buckets) {
    const ParallelConfig* best = nullptr;
    Estimate best_e;
    double least_memory = std::numeric_limits<double>::max();
    for (const ParallelConfig& c : configs) {
      Estimate e = EstimateBucket(m, hw, c, b);
      least_memory = std::min(least_memory, e.memory_bytes);
      if (e.fits && (best == nullptr || e.seconds < best_e.seconds)) best = &c, best_e = e;
    }
    if (best == nullptr) {
      return InvalidArgumentError("strategies: no strategy holds a " + std::to_string(b.max_len) +
                                  "-token sequence: the least memory any needs is " +
                                  std::to_string(static_cast<int64_t>(least_memory / 1e9)) + " GB per GPU of " +
                                  std::to_string(static_cast<int64_t>(hw.memory_bytes / 1e9)) + " GB");
    }
    r.chosen.push_back(*best);
    r.chosen_estimate.push_back(best_e);
  }
  // The best single strategy: fits every bucket, least total time (or the one asked for).
  double fixed_total = std::numeric_limits<double>::max();
  std::vector<ParallelConfig> fixed_candidates = configs;
  if (fixed != nullptr) {
    ParallelConfig f = *fixed;
    f.per_worker = hw.gpus_per_node;
    if (f.world_size() != hw.gpus) {
      return InvalidArgumentError("strategies: the fixed strategy " + f.ToString() + " has " +
                                  std::to_string(f.world_size()) + " ranks, not " + std::to_string(hw.gpus));
    }
    PTC_RETURN_IF_ERROR(ValidateConfig(spec, f), "strategies: the fixed strategy");
    fixed_candidates = {f};
  }
  for (const ParallelConfig& c : fixed_candidates) {
    double total = 0;
    bool fits = true;
    std::vector<Estimate> es;
    for (const LengthBucket& b : buckets) {
      es.push_back(EstimateBucket(m, hw, c, b));
      fits = fits && es.back().fits;
      total += es.back().seconds;
    }
    if (fits && total < fixed_total) fixed_total = total, r.fixed = c, r.fixed_estimate = es;
  }
  if (fixed_total == std::numeric_limits<double>::max()) {
    return InvalidArgumentError("strategies: " +
                                (fixed ? "the fixed strategy " + fixed->ToString() + " does not" : std::string("no single strategy can")) +
                                " hold every bucket's longest sequence in memory");
  }
  r.grad_sync_seconds = 2 * m.params * (hw.gpus - 1) / hw.gpus / hw.link_bytes_per_s;
  r.fixed_seconds = fixed_total + r.grad_sync_seconds;
  // The order: every permutation of the buckets (at most 8! orders) and every
  // chosen layout as the base; the cycle base -> buckets -> base with least switch time.
  SwitchCosts costs(spec, hw);
  std::vector<size_t> perm(buckets.size());
  std::iota(perm.begin(), perm.end(), 0);
  if (buckets.size() > 8) std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) { return buckets[a].max_len < buckets[b].max_len; });
  double best_cycle = std::numeric_limits<double>::max();
  std::vector<ParallelConfig> bases = r.chosen;
  bases.push_back(r.fixed);
  do {
    for (const ParallelConfig& base : bases) {
      double t = 0;
      std::vector<SwitchStep> steps;
      ParallelConfig at = base;
      for (size_t k = 0; k <= perm.size(); ++k) {
        const ParallelConfig& next = k < perm.size() ? r.chosen[perm[k]] : base;
        if (!(next == at)) {
          PTC_ASSIGN_OR_RETURN(SwitchStep s, costs.Get(at, next));
          t += s.seconds;
          steps.push_back(s);
        }
        at = next;
      }
      if (t < best_cycle) best_cycle = t, r.order = perm, r.base = base, r.switches = steps;
    }
  } while (buckets.size() <= 8 && std::next_permutation(perm.begin(), perm.end()));
  double buckets_time = 0;
  for (const Estimate& e : r.chosen_estimate) buckets_time += e.seconds;
  r.switching_seconds = buckets_time + best_cycle + r.grad_sync_seconds;
  return r;
}

}  // namespace ptc::transform::device
