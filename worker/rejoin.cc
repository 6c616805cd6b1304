#include "worker/rejoin.h"

#include <cstdio>
#include <optional>
#include <string>

#include "cluster/job_state.h"
#include "cluster/rejoin.h"

namespace ptcfs::worker {

ptc::Result<std::unique_ptr<ptc::cluster::Membership>> Rejoin(const RejoinTarget& target, Controller& controller,
                                                              const ptc::Store& store) {
  const std::string& job = target.membership.job;
  const int worker = target.membership.worker;
  if (controller.Busy()) return ptc::FailedPreconditionError("waiting for this mount's change to wind down");
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::Change> pending, target.coordinator->Pending());
  if (pending) {
    return ptc::FailedPreconditionError("waiting for the job's change " + pending->id + " (to generation " +
                                        std::to_string(pending->generation) + ") to end");
  }
  // The committed key's value as read: the join below holds only while the job is still there.
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::KeyValue> kv, target.kv->Get(ptc::cluster::CommittedKey(job)));
  if (!kv) return ptc::FailedPreconditionError("job " + job + " has no committed generation in etcd");
  PTC_ASSIGN_OR_RETURN(ptc::cluster::Committed committed,
                       ptc::cluster::DecodeCommitted("etcd key " + kv->key, kv->value));
  if (!ptc::cluster::AtCommitted(store, committed)) {
    const uint64_t from = store.current_generation();
    PTC_RETURN_IF_ERROR(controller.Adopt([&](ptc::Store& s) {
      return ptc::cluster::CatchUp(*target.kv, job, worker, committed, ptc::cluster::PeerClient(target.client), s);
    }));
    std::fprintf(stderr, "ptcfs: worker %d: the store moved from generation %llu to the job's %llu (from a peer)\n",
                 worker, static_cast<unsigned long long>(from), static_cast<unsigned long long>(committed.generation));
  }
  return ptc::cluster::Membership::Join(target.kv, target.membership, ptc::cluster::RejoinConditions(job, kv->value));
}

}  // namespace ptcfs::worker
