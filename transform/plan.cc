#include "transform/plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <tuple>
#include <unordered_map>

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

// Source shards grouped by tensor (numbered as the manifest lists them),
// each group in canonical order (boxes, worker, file) so that the plan does
// not depend on the manifest's order, indexed for the planner's lookups: a
// target's tensor is looked up by name once (a 671B MoE plan indexes ~160k
// shards of ~120k tensors).
struct SourceIndex {
  using Group = std::vector<size_t>;
  const std::vector<ShardRecord>* shards;
  std::unordered_map<std::string_view, size_t> tensor_id;  // into the manifest's tensors
  std::vector<Group> by_tensor;                            // live only, canonical order

  SourceIndex(const GenerationManifest& m, const std::optional<std::set<int>>& alive)
      : shards(&m.shards), by_tensor(m.tensors.size()) {
    const auto& s = m.shards;
    tensor_id.reserve(m.tensors.size());
    for (size_t t = 0; t < m.tensors.size(); ++t) tensor_id.emplace(m.tensors[t].name, t);
    for (size_t i = 0; i < s.size(); ++i) {
      if (alive && !alive->count(s[i].worker)) continue;
      if (auto it = tensor_id.find(s[i].tensor); it != tensor_id.end()) by_tensor[it->second].push_back(i);
    }
    for (Group& g : by_tensor) {
      std::sort(g.begin(), g.end(), [&](size_t a, size_t b) {
        return std::tie(s[a].boxes, s[a].worker, s[a].file) < std::tie(s[b].boxes, s[b].worker, s[b].file);
      });
    }
  }

  // The part of `group` (a tensor's sources) holding exactly `boxes`.
  std::pair<Group::const_iterator, Group::const_iterator> Same(const Group& group,
                                                               const std::vector<Box>& boxes) const {
    const auto& s = *shards;
    auto lo = std::lower_bound(group.begin(), group.end(), boxes,
                               [&](size_t i, const std::vector<Box>& b) { return s[i].boxes < b; });
    auto hi = std::upper_bound(lo, group.end(), boxes,
                               [&](const std::vector<Box>& b, size_t i) { return b < s[i].boxes; });
    return {lo, hi};
  }
};

class Planner {
 public:
  Planner(const PlanRequest& req, const SourceIndex& index, Plan* plan) : req_(req), index_(index), plan_(plan) {}

  // Target t, of the manifest's tensor `tensor`.
  void PlanTarget(size_t t, size_t tensor) {
    TargetShard& target = plan_->targets[t];
    const std::vector<size_t>& sources = index_.by_tensor[tensor];
    const auto [same_begin, same_end] = index_.Same(sources, target.key.boxes);
    for (auto it = same_begin; it != same_end; ++it) {  // (in worker order)
      if ((*index_.shards)[*it].worker == target.worker) {
        target.kept = *it;
        plan_->bytes_kept += target.nbytes;
        return;
      }
    }
    if (same_begin != same_end) target.same = *same_begin;
    const size_t elem = DTypeSize(target.dtype);
    for (const Box& box : target.key.boxes) {
      std::vector<Box> missing = {box};
      for (size_t s : sources) {  // the target's own worker's first
        if (missing.empty()) break;
        if ((*index_.shards)[s].worker == target.worker) Cover(t, s, elem, &missing);
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

// Indices into a vector, distinct by what they index: open addressing
// with linear probing over (hash, index) slots, no allocation per entry
// (a large job's layout has ~300k stored shards).
class IndexSet {
 public:
  // Adds `index` (of hash `hash`) unless an equal one is there (`equal(j)`).
  template <typename Equal>
  bool Insert(size_t index, uint64_t hash, const Equal& equal) {
    if ((count_ + 1) * 2 > slots_.size()) Grow();
    for (size_t at = hash & (slots_.size() - 1);; at = (at + 1) & (slots_.size() - 1)) {
      Slot& slot = slots_[at];
      if (slot.index == kEmpty) {
        slot = {hash, index};
        ++count_;
        return true;
      }
      if (slot.hash == hash && equal(slot.index)) return false;
    }
  }
  void Reserve(size_t n) {
    while (slots_.size() < 2 * n) Grow();
  }

 private:
  static constexpr size_t kEmpty = SIZE_MAX;
  struct Slot {
    uint64_t hash = 0;
    size_t index = kEmpty;
  };
  void Grow() {
    std::vector<Slot> old(std::max<size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.index == kEmpty) continue;
      size_t at = slot.hash & (slots_.size() - 1);
      while (slots_[at].index != kEmpty) at = (at + 1) & (slots_.size() - 1);
      slots_[at] = slot;
    }
  }
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

// A hash of a shard key on a worker: the name's and every coordinate's.
size_t HashOf(const ShardKey& key, int worker) {
  size_t h = std::hash<std::string_view>{}(key.tensor) ^ static_cast<size_t>(worker) * 0x9e3779b97f4a7c15ull;
  auto mix = [&h](Index v) { h = (h ^ static_cast<size_t>(v)) * 0xff51afd7ed558ccdull; };
  for (const Box& b : key.boxes) {
    for (Index v : b.begin) mix(v);
    for (Index v : b.end) mix(v);
  }
  return h;
}

}  // namespace

Result<std::vector<std::pair<ShardKey, int>>> TargetShardKeys(const ModelLayout& layout) {
  const ParallelConfig& config = layout.config();
  std::vector<std::pair<ShardKey, int>> out;
  IndexSet held;  // the (key, worker) pairs so far, as indices into `out`
  auto add = [&](ShardKey key, int worker) {
    const uint64_t hash = HashOf(key, worker);
    out.emplace_back(std::move(key), worker);
    const size_t last = out.size() - 1;
    if (!held.Insert(last, hash, [&](size_t j) { return out[j] == out[last]; })) out.pop_back();
  };
  std::vector<size_t> slot_begin;  // the first key of each slot in `out`
  for (int rank = 0; rank < config.world_size(); ++rank) {
    // No copy; under ZeRO-1 every rank's body is its own: none kept.
    PTC_ASSIGN_OR_RETURN(std::shared_ptr<const RankView> view, layout.Body(rank, /*keep=*/config.zero == 0));
    if (rank % config.per_worker == 0) slot_begin.push_back(out.size());
    if (rank == config.per_worker) held.Reserve(out.size() * static_cast<size_t>(config.num_workers() * config.replicas));
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
  const SourceIndex index(*req.source, req.alive);
  Plan plan;
  std::vector<size_t> tensors;  // of each target, in the manifest's tensors
  tensors.reserve(keys.size());
  plan.targets.reserve(keys.size());
  for (auto& [key, worker] : keys) {
    auto id = index.tensor_id.find(key.tensor);
    if (id == index.tensor_id.end()) {
      return CorruptionError("generation " + std::to_string(req.source->generation) + " has no tensor '" + key.tensor +
                             "' that the target config needs");
    }
    const DType dtype = req.source->tensors[id->second].dtype;
    uint64_t elems = 0;
    for (const Box& b : key.boxes) elems += b.volume();
    TargetShard t{std::move(key), worker, dtype, elems * DTypeSize(dtype), {}, {}};
    plan.bytes_total += t.nbytes;
    plan.targets.push_back(std::move(t));
    tensors.push_back(id->second);
  }
  Planner planner(req, index, &plan);
  for (size_t t = 0; t < plan.targets.size(); ++t) planner.PlanTarget(t, tensors[t]);
  for (const auto& [w, n] : planner.sent) plan.bottleneck = std::max(plan.bottleneck, n);
  for (const auto& [w, n] : planner.received) plan.bottleneck = std::max(plan.bottleneck, n);
  return plan;
}

}  // namespace ptc::transform
