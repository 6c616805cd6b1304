#include "transform/plan.h"

#include <algorithm>
#include <numeric>

namespace ptc::transform {
namespace {

// Intersect(a, b).has_value() without building the intersection: the
// planner's inner loops test far more pairs than meet.
bool Overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d) {
    if (std::max(a.begin[d], b.begin[d]) >= std::min(a.end[d], b.end[d])) return false;
  }
  return true;
}

// A shard key by reference into a manifest or a target (no copies: a 70B
// plan indexes ~90k shards).
struct KeyView {
  std::string_view tensor;
  const std::vector<Box>* boxes;
  friend bool operator<(const KeyView& a, const KeyView& b) {
    if (int c = a.tensor.compare(b.tensor); c != 0) return c < 0;
    return *a.boxes < *b.boxes;
  }
};

KeyView ViewOf(const ShardKey& key) { return {key.tensor, &key.boxes}; }

// Source shards by canonical order, indexed for the planner's lookups.
struct SourceIndex {
  const std::vector<ShardRecord>* shards;
  std::vector<bool> live;
  std::map<std::string_view, std::vector<size_t>> by_tensor;  // live only, canonical order
  std::map<std::pair<std::string_view, int>, std::vector<size_t>> by_tensor_worker;  // the same, per worker
  std::map<std::pair<KeyView, int>, size_t> by_key_worker;
  std::map<KeyView, std::vector<size_t>> by_key;  // live only, canonical order

  SourceIndex(const GenerationManifest& m, const std::optional<std::set<int>>& alive) : shards(&m.shards) {
    const auto& s = m.shards;
    std::vector<size_t> order(s.size());
    std::iota(order.begin(), order.end(), 0);
    // Canonical order makes the plan independent of the manifest's order.
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tie(s[a].tensor, s[a].boxes, s[a].worker, s[a].file) <
             std::tie(s[b].tensor, s[b].boxes, s[b].worker, s[b].file);
    });
    live.resize(s.size());
    for (size_t i : order) {
      live[i] = !alive || alive->count(s[i].worker) > 0;
      if (!live[i]) continue;
      const KeyView key{s[i].tensor, &s[i].boxes};
      by_tensor[s[i].tensor].push_back(i);
      by_tensor_worker[{s[i].tensor, s[i].worker}].push_back(i);
      by_key_worker.try_emplace({key, s[i].worker}, i);
      by_key[key].push_back(i);
    }
  }
};

class Planner {
 public:
  Planner(const PlanRequest& req, const SourceIndex& index, Plan* plan) : req_(req), index_(index), plan_(plan) {}

  void PlanTarget(size_t t) {
    TargetShard& target = plan_->targets[t];
    if (auto it = index_.by_key_worker.find({ViewOf(target.key), target.worker}); it != index_.by_key_worker.end()) {
      target.kept = it->second;
      plan_->bytes_kept += target.nbytes;
      return;
    }
    if (auto it = index_.by_key.find(ViewOf(target.key)); it != index_.by_key.end()) target.same = it->second.front();
    const size_t elem = DTypeSize(target.dtype);
    const std::vector<size_t> none;
    auto found = index_.by_tensor.find(target.key.tensor);
    const std::vector<size_t>& sources = found == index_.by_tensor.end() ? none : found->second;
    auto found_local = index_.by_tensor_worker.find({target.key.tensor, target.worker});
    const std::vector<size_t>& local = found_local == index_.by_tensor_worker.end() ? none : found_local->second;
    for (const Box& box : target.key.boxes) {
      std::vector<Box> missing = {box};
      for (size_t s : local) {
        if (missing.empty()) break;
        Cover(t, s, elem, &missing);
      }
      for (const Box& m : missing) plan_->lower_bound += m.volume() * elem;
      CoverRemote(t, sources, elem, &missing);
      for (const Box& m : missing) plan_->missing.emplace_back(target.key.tensor, m);
    }
  }

  std::map<int, uint64_t> sent, received;

 private:
  // Copies every part of `missing` that source s holds; returns bytes copied.
  uint64_t Cover(size_t t, size_t s, size_t elem, std::vector<Box>* missing) {
    uint64_t bytes = 0;
    for (const Box& held : (*index_.shards)[s].boxes) {
      std::vector<Box> still;
      for (Box& want : *missing) {
        if (!Overlaps(want, held)) {
          still.push_back(std::move(want));
          continue;
        }
        auto hit = Intersect(want, held);
        const uint64_t n = hit->volume() * elem;
        plan_->copies.push_back({t, s, *hit, n});
        bytes += n;
        for (Box& rest : Subtract(want, held)) still.push_back(std::move(rest));
      }
      *missing = std::move(still);
    }
    const int from = (*index_.shards)[s].worker, to = plan_->targets[t].worker;
    if (from == to) {
      plan_->bytes_local += bytes;
      plan_->links.local += bytes;
    } else if (bytes > 0) {
      plan_->bytes_moved += bytes;
      plan_->messages[{from, to}] += bytes;
      (req_.topology.HostOf(from) == req_.topology.HostOf(to) ? plan_->links.same_host : plan_->links.cross_host) +=
          bytes;
      sent[from] += bytes;
      received[to] += bytes;
    }
    return bytes;
  }

  bool Touches(size_t s, const std::vector<Box>& missing) const {
    for (const Box& held : (*index_.shards)[s].boxes) {
      for (const Box& want : missing) {
        if (Overlaps(want, held)) return true;
      }
    }
    return false;
  }

  // Remote pieces: repeatedly the best sender among live replicas on other
  // workers: any but a last resort first, then same host, then least bytes
  // sent so far, then lowest id.
  void CoverRemote(size_t t, const std::vector<size_t>& sources, size_t elem, std::vector<Box>* missing) {
    if (missing->empty()) return;
    const int to = plan_->targets[t].worker;
    std::vector<size_t> candidates;
    for (size_t s : sources) {
      if ((*index_.shards)[s].worker != to && Touches(s, *missing)) candidates.push_back(s);
    }
    while (!missing->empty() && !candidates.empty()) {
      auto rank = [&](size_t s) {
        const int w = (*index_.shards)[s].worker;
        return std::make_tuple(req_.last_resort.count(w) > 0, req_.topology.HostOf(w) != req_.topology.HostOf(to),
                               sent[w], w);
      };
      auto best =
          std::min_element(candidates.begin(), candidates.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });
      const size_t s = *best;
      candidates.erase(best);
      if (Touches(s, *missing)) Cover(t, s, elem, missing);
    }
  }

  const PlanRequest& req_;
  const SourceIndex& index_;
  Plan* plan_;
};

// `keys` with each key of several boxes split into keys of one box, in
// order; a (box, worker) repeated is dropped.
std::vector<std::pair<ShardKey, int>> OneBoxEach(std::vector<std::pair<ShardKey, int>> keys) {
  std::vector<std::pair<ShardKey, int>> out;
  std::set<std::pair<ShardKey, int>> seen;
  for (auto& [key, worker] : keys) {
    for (Box& box : key.boxes) {
      std::pair<ShardKey, int> one{ShardKey{key.tensor, {std::move(box)}}, worker};
      if (seen.insert(one).second) out.push_back(std::move(one));
    }
  }
  return out;
}

}  // namespace

Result<std::vector<std::pair<ShardKey, int>>> TargetShardKeys(const ModelLayout& layout) {
  const ParallelConfig& config = layout.config();
  std::vector<std::pair<ShardKey, int>> out;
  // The keys each worker holds so far, as indices into `out`.
  auto less = [&out](size_t a, size_t b) { return out[a].first < out[b].first; };
  std::map<int, std::set<size_t, decltype(less)>> held;
  auto add = [&](ShardKey key, int worker) {
    out.emplace_back(std::move(key), worker);
    if (!held.try_emplace(worker, less).first->second.insert(out.size() - 1).second) out.pop_back();
  };
  std::vector<size_t> slot_begin;  // the first key of each slot in `out`
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(std::shared_ptr<const RankView> view, layout.Body(rank));  // no copy
    if (rank % config.per_worker == 0) slot_begin.push_back(out.size());
    for (const auto* list : {&view->model, &view->optim}) {
      for (const LocalTensor& t : *list) {
        for (ShardKey& key : StoredShards(t)) add(std::move(key), config.WorkerOf(rank));
      }
    }
  }
  slot_begin.push_back(out.size());
  // Replicas: each slot's keys also on the workers of the next replicas-1 slots.
  for (int slot = 0; slot + 1 < static_cast<int>(slot_begin.size()); ++slot) {
    const std::vector<int> keepers = config.KeepersOfSlot(slot);
    for (size_t k = 1; k < keepers.size(); ++k) {
      for (size_t i = slot_begin[static_cast<size_t>(slot)]; i < slot_begin[static_cast<size_t>(slot) + 1]; ++i) {
        add(out[i].first, keepers[k]);
      }
    }
  }
  return out;
}

Result<Plan> MakePlan(const PlanRequest& req) {
  PTC_ASSIGN_OR_RETURN(const ModelLayout target, ModelLayout::Make(req.spec, req.target));
  PTC_ASSIGN_OR_RETURN(auto keys, TargetShardKeys(target));
  if (req.box_targets) keys = OneBoxEach(std::move(keys));
  std::map<std::string, DType> dtypes;
  for (const TensorRecord& t : req.source->tensors) dtypes[t.name] = t.dtype;
  Plan plan;
  for (auto& [key, worker] : keys) {
    auto dt = dtypes.find(key.tensor);
    if (dt == dtypes.end()) {
      return CorruptionError("generation " + std::to_string(req.source->generation) + " has no tensor '" + key.tensor +
                             "' that the target config needs");
    }
    uint64_t elems = 0;
    for (const Box& b : key.boxes) elems += b.volume();
    TargetShard t{std::move(key), worker, dt->second, elems * DTypeSize(dt->second), {}, {}};
    plan.bytes_total += t.nbytes;
    plan.targets.push_back(std::move(t));
  }
  SourceIndex index(*req.source, req.alive);
  Planner planner(req, index, &plan);
  for (size_t t = 0; t < plan.targets.size(); ++t) planner.PlanTarget(t);
  for (const auto& [w, n] : planner.sent) plan.bottleneck = std::max(plan.bottleneck, n);
  for (const auto& [w, n] : planner.received) plan.bottleneck = std::max(plan.bottleneck, n);
  return plan;
}

}  // namespace ptc::transform
