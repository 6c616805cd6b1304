// The controller of a mount's writes: it takes each request (a change of
// layout written to .ptcfs/config, a save through megatron/ or dcp/, a change
// the cluster job agreed, a generation adopted on rejoin) to the write of its
// kind (fs/writes/: RelayoutWrite, MegatronSaveWrite, DcpSaveWrite,
// CompactionWrite, AdoptWrite), alone over a LocalChange or, on a worker of
// a cluster job, proposed to the job or applied as its agreed change; and it
// keeps the status that .ptcfs/status shows (docs/mount_format.md).
//
// Thread safety: all methods may be called concurrently; one write holds the
// store's writer role at a time. Lock order: the WriteContext's collect_mu_,
// then its mu_ (fs/writes/write_context.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "fs/participant.h"
#include "fs/writes/compaction_policy.h"
#include "fs/writes/mount_status.h"
#include "fs/writes/write_context.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/store/store.h"
#include "view/snapshot.h"

namespace ptcfs {

struct TorchDistState;  // fs/writes/torch_dist.h

class Controller {
 public:
  // `serve` installs a snapshot as the one the mount shows; `collect` removes
  // the generations a committed one replaced (called once the state says
  // serving again). `checks`: the mount's shard verifications. `source`: the
  // store's opened dataset, or null when it has none.
  Controller(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
             std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
             std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect);
  ~Controller();  // waits for a running write
  // Waits for a running write (a rewrite, a compaction) and cancels a
  // compaction: after it no write serves a snapshot or reports (the mount's
  // teardown, before the parts a write reports to go).
  void Stop() { ctx_.Stop(); }

  // Makes this mount one worker of a cluster job (null: alone again): its
  // requests and saves go to the job, the status shows its "cluster" part,
  // no compaction runs on its own (the job runs one as a change). `job`
  // outlives the controller or is reset first.
  void SetParticipant(JobParticipant* job) { ctx_.SetJob(job); }
  // The name set whose registration order a torch_dist save of Megatron-Core's
  // distributed optimizer is read in (the mount's --names; te by default).
  // Before the first save.
  void SetMegatronNames(ptc::megatron::NameSet names) { megatron_names_ = names; }

  // A change of layout ("tp=4,pp=1" or {"config": ..., "step": S, "epoch":
  // E}, RelayoutWrite). Alone: written at once. In a job: once valid, proposed
  // to it (JobParticipant::Propose; state "proposed" until this worker
  // applies it with Apply, or EndProposal).
  // \error InvalidArgument naming what is wrong (kept as last_error);
  //        FailedPrecondition while a write runs; in a job as Propose.
  ptc::Status Reconfigure(const std::string& text, const std::shared_ptr<const Snapshot>& current);
  // Applies the change of layout `text` the job agreed (RelayoutWrite::Run):
  // on an error change->Failed is called too, and the state is "failed".
  ptc::Status Apply(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                    std::shared_ptr<AgreedChange> change);
  // The change this mount proposed ended before it applied it: state
  // "failed", `why` kept as last_error. Nothing when the state is not
  // "proposed", or with `by_agent` (a recovery the agent proposed on its own)
  // not "serving" either.
  void EndProposal(const ptc::Status& why, bool by_agent);
  // A cluster job is whole again: a "failed" state ends (MountStatus::Resolve).
  void Recovered(const std::string& why);

  // Commits the Megatron save of `iteration` staged under `staging_root`
  // (MegatronSaveWrite; a torch_dist save, with metadata.json, a
  // DcpSaveWrite in Megatron-Core's keys) and serves it; blocks until
  // committed. In a job it is proposed (JobParticipant::ProposeSave or
  // ProposeDcpSave) and this worker writes its part. On an error the current
  // generation stays, the state is as before and the error kept.
  // \error FailedPrecondition while a write runs (in a job as ProposeSave);
  //        as MegatronSaveWrite::Run or DcpSaveWrite::Run alone; in a job
  //        IOError naming why the save failed.
  ptc::Status Ingest(const std::string& staging_root, uint64_t iteration,
                     const std::shared_ptr<const Snapshot>& current);
  // Commits the DCP save in `dir` (`save`: its name in the staging area),
  // DcpSaveWrite in torch's keys, as Ingest does; `committed` runs after the
  // commit and before the new generation is served.
  // \error as Ingest; as DcpSaveWrite::Run and in a job ProposeDcpSave.
  ptc::Status IngestDcp(const std::string& dir, const std::string& save, const std::shared_ptr<const Snapshot>& current,
                        const std::function<void()>& committed);
  // Apply a save the job agreed (another worker's Ingest or IngestDcp, whose
  // .metadata is `metadata`; `keys` kTorch for dcp/, kMegatronCore for
  // torch_dist): this worker's part in the background (state "saving").
  // ApplyDcpSave runs `done(true)` after the commit and before the new
  // generation is served, ApplySave once it is over; `done(false)` after a
  // failure; neither when this returns an error. On an error change->Failed
  // is called, the state is "failed" and the previous generation stays.
  // \error FailedPrecondition while a write runs.
  ptc::Status ApplyDcpSave(const std::string& dir, std::string metadata, ptc::dcp::Keys keys,
                           const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                           std::function<void(bool committed)> done);
  ptc::Status ApplySave(const std::string& staging_root, uint64_t iteration,
                        const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                        std::function<void(bool committed)> done);

  // Whether a write or a compaction of the job runs.
  bool Busy() const { return ctx_.Busy(); }
  // Whether the policy wants the served generation compacted by the job
  // (CompactionWrite::Due).
  bool CompactionDue(const std::shared_ptr<const Snapshot>& current);
  const CompactionPolicy& compaction_policy() const { return ctx_.compaction_policy(); }
  // Applies a compaction the job agreed, in the background
  // (CompactionWrite::Run), serving `current` meanwhile.
  // \error FailedPrecondition while a write or compaction runs (change->Failed too).
  ptc::Status ApplyCompaction(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                              std::shared_ptr<AgreedChange> change);
  // Stops a compaction of the job at its next chunk; nothing when none runs.
  void CancelCompaction() { ctx_.CancelCompaction(); }

  // Brings the store to a generation no write of this mount wrote and
  // serves it (AdoptWrite::Run, state "rejoining").
  ptc::Status Adopt(const std::function<ptc::Status(ptc::Store&)>& write);

  // The status document (docs/mount_format.md). Bad bytes (invalid UTF-8 in
  // last_error or a path) are replaced, never thrown. `passthrough`, when not
  // null, is shown as the field "passthrough".
  std::string StatusJson(const std::shared_ptr<const Snapshot>& current,
                         const nlohmann::json& passthrough = nullptr) const;
  // Keeps `error` as last_error, cut to kMaxLastError bytes (the next commit clears it).
  void RecordError(const std::string& error) { ctx_.RecordError(error); }
  // Removes replaced generations now, unless a write runs (its commit does):
  // after the last file of a replaced generation was closed, and at unmount.
  void CollectIfIdle() { ctx_.Collect(/*only_when_idle=*/true); }

  // The most bytes of last_error kept; longer ones end in "... (N bytes cut)".
  static constexpr size_t kMaxLastError = MountStatus::kMaxLastError;

 private:
  // A valid request handed to the job (Reconfigure in a job).
  ptc::Status Propose(JobParticipant& job, const std::string& text, const std::shared_ptr<const Snapshot>& current);
  // A torch_dist save in `iter_dir` (`name` in the staging area).
  ptc::Status SaveTorchDist(JobParticipant* job, const std::string& iter_dir, const std::string& name,
                            uint64_t iteration, const std::shared_ptr<const Snapshot>& current);
  // A DCP save alone, or proposed to `job` (with its .metadata) and this
  // worker's part written; on an error the job is told.
  ptc::Status SaveDcp(JobParticipant* job, const std::string& dir, const std::string& save, ptc::dcp::Keys keys,
                      const TorchDistState* state, const std::shared_ptr<const Snapshot>& current,
                      const std::function<void()>& committed);

  WriteContext ctx_;
  ptc::megatron::NameSet megatron_names_ = ptc::megatron::NameSet::kTe;
};

}  // namespace ptcfs
