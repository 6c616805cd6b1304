// Bringing a worker's store up to its job's committed generation
// (docs/cluster.md, "Lost workers"): a worker that was away (killed, cut
// off, replaced by an empty disk) while the job moved on cannot join with
// the generation it has. Before it mounts, it takes the committed
// generation's manifest from a live worker, checks it against the digest
// etcd holds, checks that it holds the pieces the manifest places on it, and
// commits that manifest as its own generation of the same number. Its
// pieces elsewhere are then read from their workers (PeerEnv), and the next
// change may give it ranks again.
//
// Thread safety: call once, before the store is shared.
#pragma once

#include <string>
#include <vector>

#include "cluster/kv_store.h"
#include "cluster/job_state.h"
#include "cluster/peer_client.h"
#include "ptc/base/status.h"
#include "ptc/store/store.h"

namespace ptc::cluster {

// Whether the store's current generation is `committed` (number, config and pieces).
bool AtCommitted(const Store& store, const Committed& committed);

// The job's `committed` generation's manifest, from the first live member of
// `job` other than `skip` (-1: none) that serves it with the config and
// digest etcd holds.
// \error FailedPrecondition naming each asked worker's answer when none
//        serves it (or no other worker is live); as ListMembers.
Result<GenerationManifest> FetchCommitted(const KvStore& etcd, const std::string& job, int skip,
                                          const Committed& committed, const PeerClient& client);

// Commits the job's `committed` generation in `store` (opened with the
// worker's PeerEnv, so that other workers' files count as present), from the
// first live member of `job` other than `worker` that serves it.
// \error FailedPrecondition when no other worker is live, none serves the
//        generation with etcd's digest (each one's answer named), the store
//        lacks or holds damaged pieces the manifest places on this worker
//        (named; nothing is written), or the store holds a generation at or
//        above it; as Store::BeginGenerationAt and GenerationWriter::Commit.
Status CatchUp(const KvStore& etcd, const std::string& job, int worker, const Committed& committed,
               const PeerClient& client, Store& store);

// The comparisons under which a worker whose membership was lost (its lease
// expired while its link was cut) joins again once its store is at the job's
// committed generation (Membership::Join's only_if): the committed key still
// holds `committed_value` (as read before catching up) and no change is under
// way. So no change is proposed without it between its catching up and its
// joining, and none lists it before it has caught up.
std::vector<Compare> RejoinConditions(const std::string& job, const std::string& committed_value);

}  // namespace ptc::cluster
