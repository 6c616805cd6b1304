// The control loop of one cluster worker (docs/cluster.md): the peer
// server, the worker's membership of its job, and the agent's thread, which
// follows the job's key-value store: the members' addresses, changes to apply
// (Controller::Apply with the coordinator's commit), a change none of whose
// participants is live (withdrawn), workers lost (a recovery onto the
// survivors, proposed by the lowest live worker), a fragmented generation (a
// compaction, proposed by the lowest live worker), a lease lost (Rejoin),
// the durable tier's copy, and the "cluster" part of .ptcfs/status.
//
// Thread safety: Start once; Propose and StatusPart are called from FUSE
// threads (the controller's hooks), everything else from the agent's thread
// ("the loop's own" below). The destructor stops the thread, leaves the job
// and stops the peer server.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/change_request.h"
#include "cluster/coordinator.h"
#include "cluster/kv_store.h"
#include "cluster/membership.h"
#include "cluster/peer_env.h"
#include "cluster/peer_server.h"
#include "fs/filesystem.h"
#include "fs/participant.h"
#include "ptc/base/mutex.h"
#include "worker/durable_keeper.h"
#include "worker/rejoin.h"
#include "worker/worker_options.h"

namespace ptcfs::worker {

class Agent final : public JobParticipant {
 public:
  // `kv`, `coordinator`, `env` and `fs` outlive the agent.
  Agent(Filesystem* fs, WorkerOptions options, const ptc::cluster::KvStore* kv,
        const ptc::cluster::Coordinator* coordinator, ptc::cluster::PeerEnv* env)
      : fs_(fs), options_(std::move(options)), kv_(kv), coordinator_(coordinator), env_(env) {}
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts the peer server, joins the job (a lease), hooks the controller
  // (proposals, status) and starts the agent's thread.
  // \error as PeerServer::Start and Membership::Join.
  ptc::Status Start();

  // Before Start: the store holds `generation`, restored from the durable
  // tier in the copy's layout (tier_restore.h); the job had moved to
  // `config` since (the same contents). Once every worker that config needs
  // is live, the lowest live worker proposes it (Resume); dropped when the
  // job moves on first.
  void ResumeLayout(uint64_t generation, std::string config) {
    resume_generation_ = generation;
    resume_config_ = std::move(config);
  }

 private:
  // On a FUSE thread, or the agent's (Recover). membership_ is the agent's own: not read here.
  ptc::Status Propose(const std::string& text, const ptc::ParallelConfig& config) override;
  // From a FUSE thread: the save as a change of every live member; this
  // mount's own part goes through the returned change (its controller is
  // busy saving, so the loop does not apply it here).
  ptc::Result<std::shared_ptr<AgreedChange>> ProposeSave(uint64_t iteration) override;
  ptc::Result<std::shared_ptr<AgreedChange>> ProposeDcpSave(const std::string& save,
                                                            const std::string& metadata) override;

  // Proposes `request` to the live members (`needed`: the workers it must
  // include), from this mount's generation. `again` ends the message when
  // this worker is no member now ("try again", "save again").
  // \error InvalidArgument as ValidateRequest; as Coordinator::Propose.
  ptc::Result<ptc::cluster::Change> ProposeToJob(const ptc::cluster::ChangeRequest& request,
                                                 const std::vector<int>& needed, const std::string& again);

  // The change this mount proposed, until its agent applied it or saw it end.
  std::optional<ptc::cluster::Change> Proposed() EXCLUDES(proposed_mu_);

  // The change this mount proposed (`asked`, read before `pending`) is over
  // for the agent once applied; one the job no longer has that it never
  // applied was aborted first (another participant failed at once): the
  // mount's state says so (Controller::EndProposal).
  void Settle(const ptc::cluster::Change& asked, const ptc::Result<std::optional<ptc::cluster::Change>>& pending);

  // The members' addresses and the generations served, into the env and the
  // server; `live` gets the live workers, sorted. Returns etcd's revision of
  // the members read (0 when it failed, and `live` is left empty).
  int64_t Follow(std::vector<int>* live = nullptr);

  // Reads the members and the change under way, then sleeps until etcd holds
  // something newer (a watch of the job's keys), at most kFollowEvery: a
  // commit by this mount's own rewrite changes no key, and the generations
  // served follow the store.
  void Loop();

  // A change none of whose participants is live (all died or were cut off
  // while it ran) has no one left to abort it: any worker withdraws it.
  void WithdrawOrphan(const ptc::cluster::Change& change, const std::vector<int>& live);

  // When workers of the committed config have left the job (their leases
  // expired after this agent saw them live), the lowest live worker proposes
  // the survivors' config (SurvivorConfig): the change then runs as any
  // other, sourcing the lost workers' pieces from their replicas. Once per
  // (generation, live members): a change that cannot run (pieces on no live
  // worker) fails, naming them, and is not retried until either changes.
  void Recover(const std::vector<int>& live);

  // A save leaves each piece on the worker that wrote it only. When the job
  // keeps replicas (replicas=R > 1), the lowest live worker then proposes the
  // same config again: its change copies every piece to its keepers (the
  // plan's targets include them). Once per save. Returns whether it proposed.
  bool Replicate(const std::vector<int>& live);
  // ResumeLayout's proposal. Returns whether it proposed.
  bool Resume(const std::vector<int>& live);

  // When the committed generation is fragmented past this mount's policy
  // (Controller::CompactionDue), the lowest live worker proposes a compaction
  // of it ("compact", or "compact rank-files" with rank files): every worker
  // then rewrites its own pieces (Controller::ApplyCompaction), and the job
  // commits them together or not at all. Once per (generation, live members).
  void Compact(const std::vector<int>& live);

  // Before this mount proposes `request`: a compaction under way gives way
  // (withdrawn, kCompactionGivesWay); when it committed first, waits (a
  // while) until this mount serves its generation.
  void OvertakeCompaction(const std::string& request);

  // Once every worker of the committed config is live again after some were
  // not, a "failed" state the loss left ends (Controller::Recovered).
  void NoteWhole(const std::vector<int>& live);

  // Whether this worker is a member of the job in step with it. While no
  // renewal of its lease succeeds (etcd, or the link to it, away for a whole
  // lease) it is not sure: .ptcfs/status and stderr say so, it serves what it
  // has and goes on renewing; an etcd that starts again renews every lease,
  // and it is a member as before. One whose lease was lost (its link was cut
  // longer than the lease), or that a change committed without (a race with a
  // recovery as it rejoined), stops being one: status and stderr say so, and
  // it rejoins (Rejoin, worker/rejoin.h) on a later look, once etcd answers.
  bool InStep(const ptc::Result<std::optional<ptc::cluster::Change>>& pending);

  // etcd renewed the lease again (it was away, then started again): the
  // worker is a member as it was, nothing was lost.
  void Resume();

  // Whether a change committed without this member while it was not busy
  // (only the agent's thread starts changes: its own are over).
  bool Behind(const ptc::Result<std::optional<ptc::cluster::Change>>& pending);

  // Keeps `message` as last_error and logs it when it changed.
  void NoteAway(const std::string& message);

  // The "cluster" part of .ptcfs/status (docs/mount_format.md): this
  // worker's view of its job, made again when the generation or the live
  // members change (a plan per look would be too slow for a large model).
  void Report(const std::vector<int>& live);

  // Report's part and whether this worker is a member now (JobParticipant).
  nlohmann::json StatusPart() const override EXCLUDES(report_mu_);

  // Applies `change` to the mount (its request decoded, ChangeRequest, and
  // handed to the mount's one door for changes, ChangeApplier, with an
  // AppliedChange of agent.cc) when this worker takes part, its store is at
  // the change's `from` and it has not applied it yet; while the previous
  // change winds down, the next look does. A request that does not decode
  // fails the change, naming the field at fault.
  void Apply(const ptc::cluster::Change& change);
  // The .metadata of the DCP save `r`: published by this worker's server, or
  // fetched from the proposer's (checked against the request's length and checksum).
  ptc::Result<std::string> DcpMetadata(const ptc::cluster::DcpSaveRequest& r) const;

  Filesystem* const fs_;
  const WorkerOptions options_;
  const ptc::cluster::KvStore* const kv_;
  const ptc::cluster::Coordinator* const coordinator_;
  ptc::cluster::PeerEnv* const env_;
  std::shared_ptr<ptc::cluster::PeerServer> server_;  // shared with the changes it applies
  std::unique_ptr<ptc::cluster::Membership> membership_;  // replaced when it rejoins (the loop's own after Start)
  bool held_ = true;                            // membership_ may still be renewed (the loop's own)
  std::atomic<bool> member_{true};              // membership_ is renewed and in step with the job
  RejoinTarget rejoin_;                         // how it joins again (set by Start)
  std::string away_, noted_;                    // what status says while it rejoins (the loop's own)
  std::vector<std::shared_ptr<const ptc::GenerationManifest>> served_ = {nullptr, nullptr};
  std::string applied_;  // the id of the last change applied (the loop's own)
  std::map<int, ptc::cluster::PeerAddress> peers_;  // the live members' addresses at the last look (the loop's own)
  ptc::Mutex proposed_mu_;
  std::optional<ptc::cluster::Change> proposed_ GUARDED_BY(proposed_mu_);  // see Settle
  std::set<int> seen_;   // workers seen live since the mount started or rejoined (the loop's own)
  std::pair<uint64_t, std::vector<int>> tried_;  // the last recovery proposed (the loop's own)
  std::string recovery_;                         // the id of that change (the loop's own)
  uint64_t resume_generation_ = 0;  // ResumeLayout's; the agent's thread's after Start
  std::string resume_config_;
  std::atomic<uint64_t> saved_{0};               // the generation of the last save committed with this worker
  std::pair<uint64_t, std::vector<int>> compact_looked_;  // what Compact measured last (the loop's own)
  bool missing_ = false;  // a worker of the committed config was not live at the last look (the loop's own)
  std::unique_ptr<DurableKeeper> durable_;  // with --durable
  std::pair<uint64_t, std::vector<int>> reported_;  // what report_ was made for (the loop's own)
  mutable ptc::Mutex report_mu_;
  nlohmann::json report_ GUARDED_BY(report_mu_) = nlohmann::json::object();
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ptcfs::worker
