// The repartitioning planner: which bytes go where when a stored generation
// is rewritten for another parallel config. Pure functions over metadata; no
// I/O. Every worker computing a plan from the same inputs gets the same plan,
// whatever the order of the source shards.
//
// Terms (see docs/design.md): the target's stored shards are what the
// target config's views need on each worker (replicas inside a worker stored
// once). A target shard identical (tensor and boxes) to a live source shard on
// its own worker is *kept*: no bytes. Every other target box is covered by
// *copies*: first from sources on the target's own worker (local), then from
// other workers (messages), choosing among replicas the sender on the same
// host first, then the least loaded sender so far, then the lowest worker id
// (a last-resort sender only where no other holds the bytes).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"
#include "ptc/store/manifest.h"

namespace ptc::transform {

struct Topology {
  int workers_per_host = 1;  // host(w) = w / workers_per_host
  int HostOf(int worker) const { return worker / workers_per_host; }
};

struct PlanRequest {
  const GenerationManifest* source = nullptr;  // its shards are the sources
  ModelSpec spec;
  ParallelConfig target;
  Topology topology{};
  std::optional<std::set<int>> alive{};  // workers whose shards can be read; nullopt: all
  // Workers read from only for bytes no other live worker holds (a cluster's
  // durable tier, docs/cluster.md); never targets.
  std::set<int> last_resort = {};
  // Each target one box: a shard of several boxes (a fused tensor's parts)
  // becomes one target per box, each stored as a piece of its own (the
  // chunks of a DCP rank file, view/rank_files.h).
  bool box_targets = false;
};

struct TargetShard {
  ShardKey key;
  int worker = 0;
  DType dtype = DType::kF32;
  uint64_t nbytes = 0;
  std::optional<size_t> kept;  // index of the identical live source shard on this worker
  std::optional<size_t> same;  // an identical live source shard on another worker (a shared store may reference it)
};

struct Copy {
  size_t target;  // index into Plan::targets
  size_t source;  // index into the source manifest's shards
  Box region;     // global coordinates, inside one box of each
  uint64_t nbytes;
};

struct LinkBytes {
  uint64_t local = 0;       // copies inside a worker
  uint64_t same_host = 0;   // between workers of one host
  uint64_t cross_host = 0;  // between hosts
};

struct Plan {
  std::vector<TargetShard> targets;
  std::vector<Copy> copies;  // grouped by target, in target order
  // (sender, receiver) -> bytes, for sender != receiver.
  std::map<std::pair<int, int>, uint64_t> messages;
  LinkBytes links;
  uint64_t bytes_total = 0;  // all target shards
  uint64_t bytes_kept = 0;   // target shards kept as they are
  uint64_t bytes_local = 0;  // copied from the target's own worker
  uint64_t bytes_moved = 0;  // received from other workers
  uint64_t lower_bound = 0;  // bytes of which no live replica is on the target's worker
  uint64_t bottleneck = 0;   // max over workers of bytes sent or received
  // Regions no live source holds: (tensor, box). Non-empty: the plan cannot run.
  std::vector<std::pair<std::string, Box>> missing;
};

// \error as ModelLayout::Make for the target; Corruption when the source manifest
//        names a tensor the model does not have.
Result<Plan> MakePlan(const PlanRequest& request);

// The target stored shards of a config: for every rank's local tensors, their
// StoredShards, deduplicated per worker, in rank order; then, with replicas R,
// each slot's on the workers of the next R-1 slots (ParallelConfig::KeepersOfSlot).
// \error as ModelLayout::View.
Result<std::vector<std::pair<ShardKey, int>>> TargetShardKeys(const ModelLayout& layout);

}  // namespace ptc::transform
