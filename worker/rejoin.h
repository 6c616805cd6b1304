// A mounted worker that lost its membership of its job (its lease expired
// while its link was cut, or a change committed without it) comes back by
// itself (docs/cluster.md, "Lost workers"): once nothing of its own is under
// way and the job has no change under way, it brings its store to the job's
// committed generation from a live peer (CatchUp), serves that generation,
// and only then joins again, under a new lease. So no change lists it as a
// participant before it has caught up.
//
// Thread safety: call from the agent's thread (the only one that starts
// changes on a cluster mount).
#pragma once

#include <memory>

#include "cluster/coordinator.h"
#include "cluster/kv_store.h"
#include "cluster/membership.h"
#include "cluster/peer_client.h"
#include "fs/controller.h"
#include "ptc/base/status.h"
#include "ptc/store/store.h"

namespace ptcfs::worker {

struct RejoinTarget {
  const ptc::cluster::KvStore* kv = nullptr;
  const ptc::cluster::Coordinator* coordinator = nullptr;
  ptc::cluster::MembershipOptions membership;  // job, worker, address, lease
  ptc::cluster::PeerClientOptions client;      // for the committed manifest, from a peer
};

// One attempt, on one look of the agent: waits (an error) while `controller`
// is busy (a change this worker took part in winds down) or the job has a
// change under way; else reads the job's committed state, brings `store` to
// it when it is not there (ptc::cluster::CatchUp through Controller::Adopt, which
// serves it), and joins while the job is still there (ptc::cluster::RejoinConditions).
// \error FailedPrecondition while it waits, when the job changed before the
//        join (the next attempt catches up again), or as CatchUp (no live
//        peer serves the generation, the store lacks pieces: named);
//        AlreadyExists when a live member holds this worker's index; as
//        Coordinator::Pending and GetCommitted (IOError while etcd cannot be
//        reached), Controller::Adopt and Membership::Join. The caller keeps it
//        as last_error and tries again later; nothing is left half done.
ptc::Result<std::unique_ptr<ptc::cluster::Membership>> Rejoin(const RejoinTarget& target, Controller& controller,
                                                              const ptc::Store& store);

}  // namespace ptcfs::worker
