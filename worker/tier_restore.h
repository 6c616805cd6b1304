// A worker with an empty store whose job's every worker was lost resumes
// from the durable tier (docs/cluster.md, "Every worker lost";
// cluster/durable_restore.h does the restore itself). Called by
// Worker::Prepare before it catches up or joins.
//
// Thread safety: once, before the store is shared.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cluster/coordinator.h"
#include "cluster/job_state.h"
#include "cluster/kv_store.h"
#include "ptc/base/status.h"
#include "ptc/store/store.h"
#include "worker/worker_options.h"

namespace ptcfs::worker {

// What a restore did.
struct TierRestore {
  uint64_t generation = 0;  // restored, in the copy's layout
  // The layout the job had moved to after the copy (same contents): etcd's
  // lost committed config, else the tier's job record; empty when the copy's.
  std::string resume_config;
};

// When `store` holds no generation, the job has a durable tier holding a copy
// of it, and no live worker can give the store the job's generation:
//   - etcd holds nothing of the job (it was lost too): the copy is restored
//     as generation copy+1, which becomes the job's;
//   - the job's committed generation is the one another worker restored
//     (the same digest): that one is restored here too;
//   - the job's committed generation, of the copy's contents, has no live
//     worker left: the copy is restored as committed+1, which replaces it.
// The store is then joined to the job (Coordinator::Join, the copy's
// contents kept: the tier's copy serves the restored job). Nullopt when the
// store is to catch up or join as usual.
// \error as ReadDurableCopy (but NotFound, or any while a worker is live:
//        nullopt), RestoredManifest, RestoreShare, Coordinator::Join, the KvStore.
ptc::Result<std::optional<TierRestore>> RestoreFromTier(const WorkerOptions& options,
                                                        const ptc::cluster::KvStore& kv,
                                                        const ptc::cluster::Coordinator& coordinator,
                                                        const std::optional<ptc::cluster::Committed>& job,
                                                        ptc::Store& store);

}  // namespace ptcfs::worker
