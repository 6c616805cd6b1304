// Reconfiguration of a mounted store: validates a requested config, switches
// the served layout at once (new views over the current generation's
// shards), rewrites the store in the background with the repartitioning
// engine, and switches to the new generation when it commits. Keeps the
// status that .ptcfs/status shows.
//
// Thread safety: all methods may be called concurrently; one reconfiguration
// runs at a time.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fs/participant.h"
#include "ptc/base/mutex.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"
#include "transform/covering.h"
#include "view/rank_files.h"
#include "view/snapshot.h"

namespace ptcfs {

// When the mount compacts in the background (after a reconfigure commits a
// covering, docs/mount_format.md): when the generation's shards are read from
// more than `max_pieces_per_shard` pieces on average, or from a piece smaller
// than `min_piece_bytes`. The compaction runs at the lowest CPU priority,
// serves on meanwhile, and gives way to a reconfigure or a save (cancelled,
// nothing committed).
struct CompactionPolicy {
  double max_pieces_per_shard = 8;  // 0: never on this rule
  uint64_t min_piece_bytes = 0;     // 0: never on this rule
  // Write the files the job reads (the layout's safetensors files, megatron/'s
  // or dcp/'s) whole as rank files (view/rank_files.h), which the kernel can
  // then read itself (--passthrough auto).
  bool rank_files = false;
  RankFileOptions rank_file_options;  // their format, and which copies they hold (--rank-file-copies)
  // Whether a compaction stores a piece per box (DCP rank files: BoxTargets).
  bool box_targets() const { return rank_files && BoxTargets(rank_file_options); }
  bool Due(const ptc::transform::Fragmentation& f) const {
    return (max_pieces_per_shard > 0 && f.pieces_per_shard() > max_pieces_per_shard) ||
           (min_piece_bytes > 0 && f.pieces > 0 && f.smallest_piece < min_piece_bytes);
  }
};

struct ChangeSource;  // what a cluster change reads (controller.cc)

// What the mount is doing (.ptcfs/status "state", docs/mount_format.md).
enum class MountState {
  kServing,         // serving its generation, nothing under way
  kProposed,        // a request went to the job; this worker has not applied it yet
  kRepartitioning,  // a change of layout is being written (served at once from the old shards)
  kSaving,          // a save through megatron/ is being committed
  kRejoining,       // a cluster worker brings its store to the job's generation
  kFailed,          // the last change or save failed (last_error says why); serving as before
};
// "serving", "proposed", "repartitioning", "saving", "rejoining", "failed".
const char* MountStateName(MountState state);

class Controller {
 public:
  // `serve` installs a snapshot as the one the mount shows; `collect` removes
  // the generations a committed one replaced (called once the state says
  // serving again: cleanup is not part of the wait). `checks`: the mount's
  // shard verifications. `source`: the store's opened dataset, or null when
  // it has none.
  Controller(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
             std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
             std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect);
  ~Controller();  // waits for a running rewrite

  // Parses "tp=4,pp=1" or {"config": "tp=4,pp=1", "step": S, "epoch": E},
  // validates it against the model (and the step against the dataset),
  // switches the layout and data position and starts the rewrite, which
  // commits the new dataset position with the new layout.
  // \error InvalidArgument naming what is wrong (also kept as last_error);
  // \error FailedPrecondition while a rewrite runs.
  // In a cluster (SetParticipant) the request goes to the job instead, once
  // valid (state "proposed" until this worker applies it, or EndProposal):
  // every worker then applies it with Apply.
  ptc::Status Reconfigure(const std::string& text, const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_);

  // Makes this mount one worker of a cluster job: Reconfigure hands valid
  // requests to the job (JobParticipant::Propose) and Ingest its saves
  // (ProposeSave), the status document shows its "cluster" part; no
  // compaction runs on its own after a change (a worker alone would commit a
  // generation the job does not have): the job runs it as a change
  // (CompactionDue, ApplyCompaction). `job` outlives the controller or is
  // reset (null) first.
  void SetParticipant(JobParticipant* job) EXCLUDES(mu_) {
    ptc::MutexLock lock(&mu_);
    job_ = job;
  }

  // Applies a change the cluster agreed on (Reconfigure's text): as
  // Reconfigure does alone, with the rewrite as `change` says. On an error
  // here change->Failed is called too, and the state is "failed".
  ptc::Status Apply(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                    std::shared_ptr<AgreedChange> change) EXCLUDES(mu_);

  // The change this mount proposed ended before it applied it (the job
  // aborted it first: another worker failed at once): state "failed",
  // `why` kept as last_error. Nothing when the state is not "proposed", or
  // with `by_agent` (the agent proposed it on its own, a recovery onto the
  // survivors, with no request through this mount) not "serving" either.
  void EndProposal(const ptc::Status& why, bool by_agent) EXCLUDES(mu_);

  // A cluster job is whole again (every worker of its committed config live,
  // nothing under way) after it lost some: a "failed" state that the loss
  // left (a recovery that could not run) ends. The state is "serving",
  // last_error moves to earlier_error with `why` after it. Nothing in
  // another state.
  void Recovered(const std::string& why) EXCLUDES(mu_);

  // Commits the Megatron save of `iteration` staged under `staging_root`
  // (megatron/ writes, fs/staging.h) as a new generation, in the current
  // config with the save's tp and pp (from its args), and serves it. With a
  // dataset, the save's args.consumed_train_samples is the new data position,
  // committed in the same generation. Blocks until committed; on any error
  // the current generation stays (also kept as last_error); a commit clears
  // last_error. In a cluster the save goes to the job
  // (JobParticipant::ProposeSave): this worker adds the rank files staged
  // here, every other live worker its own (ApplySave), and all commit it
  // together or none does.
  // \error FailedPrecondition while a rewrite runs (in a cluster: while the
  //        job runs a change); in a cluster, IOError naming why the job
  //        aborted the save (as SettleSave, a worker that left, ...);
  //        InvalidArgument with zero=1 (Megatron's files do not hold ZeRO-1
  //        state), for a consumed_train_samples that is no position of the
  //        dataset (off the global batch; the count is cumulative,
  //        docs/dataset_format.md) or a state dict iteration other than
  //        `iteration`; as OpenMegatronCheckpoint and ImportInto (a missing
  //        rank names it); in a cluster as SettleSave.
  ptc::Status Ingest(const std::string& staging_root, uint64_t iteration,
                     const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_, collect_mu_);

  // Commits the PyTorch DCP save in `dir` (a directory of dcp/ that dcp.save
  // wrote, fs/staging.h) as a new generation in the current config, each
  // chunk a stored piece (ptc/checkpoint/dcp/read.h), and serves it; the data
  // position stays. `committed` runs after the commit and before the new
  // generation is served (the staged files are in the store then). Blocks
  // until committed; on any error the current generation stays (also kept as
  // last_error). In a cluster (SetParticipant) the save goes to the job
  // (JobParticipant::ProposeDcpSave, `save`: the directory's name in the
  // staging area) and every worker adds the chunk files written on it
  // (ApplyDcpSave); it commits everywhere or nowhere.
  // \error FailedPrecondition while a rewrite runs; InvalidArgument when the
  //        save holds no optimizer state and the store does (it would be
  //        lost); as OpenDcp (naming the key and chunk) and WriteDcp; in a
  //        cluster as ProposeDcpSave and SettleDcpSave (a chunk file on no
  //        worker or on two).
  ptc::Status IngestDcp(const std::string& dir, const std::string& save, const std::shared_ptr<const Snapshot>& current,
                        const std::function<void()>& committed) EXCLUDES(mu_, collect_mu_);

  // Applies a DCP save the cluster agreed on (another worker's IngestDcp,
  // whose .metadata is `metadata`): this worker's part is the chunk files in
  // `dir` (perhaps none). As ApplySave otherwise, but `done(true)` runs after
  // the commit and before the new generation is served (its tree lists the
  // staging area as it is then).
  // `keys`: kTorch for a dcp/ save, kMegatronCore for a torch_dist save of megatron/.
  ptc::Status ApplyDcpSave(const std::string& dir, std::string metadata, ptc::dcp::Keys keys,
                           const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                           std::function<void(bool committed)> done) EXCLUDES(mu_, collect_mu_);

  // Applies a save the cluster agreed on (another worker's Ingest): this
  // worker's part is the rank files of `iteration` staged under
  // `staging_root` (perhaps none). Runs in the background (state "saving");
  // `done(committed)` runs once it is over (committed: the staged files are
  // in the store then), unless this returns an error. On an error,
  // change->Failed is called, the state is "failed" and the previous
  // generation stays.
  ptc::Status ApplySave(const std::string& staging_root, uint64_t iteration,
                        const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                        std::function<void(bool committed)> done) EXCLUDES(mu_, collect_mu_);

  // Whether a rewrite, a save, an Adopt or a compaction of the job runs (a
  // new change would be refused; a compaction gives way to the next change
  // applied, CancelCompaction).
  bool Busy() const EXCLUDES(mu_);

  // A cluster mount (docs/cluster.md, "Compaction"): measures the served
  // generation `current` (the status shows it) and says whether the policy
  // wants it compacted (and there is something to write). Pure of the store
  // but for the measure: every worker decides the same from the same
  // generation and policy. False on a failure (kept as last_error).
  bool CompactionDue(const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_);
  const CompactionPolicy& compaction_policy() const { return compaction_; }

  // Applies a compaction the cluster agreed (a change of the same config):
  // in the background, at the lowest CPU priority with one thread, serving
  // `current` meanwhile (state "serving", "compaction" running), this worker
  // rewrites its own pieces of `current`'s generation compactly (with
  // `rank_files`, into its ranks' rank files: PlanRankFileCompaction), then
  // commits with the job (change->BeforeCommit) and serves the new
  // generation. Nothing is committed anywhere when it fails or is cancelled
  // (change->Failed: a writer that takes the role cancels it, the job's
  // change aborted with kCompactionGivesWay).
  // \error FailedPrecondition while a rewrite, save or compaction runs
  //        (change->Failed is called too).
  ptc::Status ApplyCompaction(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                              std::shared_ptr<AgreedChange> change) EXCLUDES(mu_);

  // Stops a compaction of the job at its next chunk (the job moved on to
  // another change); nothing when none runs.
  void CancelCompaction() EXCLUDES(mu_);

  // Brings the store to a generation that no change or save of this mount
  // wrote (a cluster worker catching up with its job after it lost its
  // membership, cluster/rejoin.h): runs `write`, which commits it, as the
  // store's only writer (state "rejoining"), then serves the store's current
  // generation in its own config, as a change's commit is served, and removes
  // the generations it replaced that no open file reads. Open files keep
  // reading the generation they were opened in. last_error stays as it was
  // when served (the caller's own, e.g. "rejoining", until it is done).
  // \error FailedPrecondition while a rewrite or save runs; as `write` (the
  //         generation served before stays); as SpecFromManifest,
  //         ConfigFromManifest, LoadDatasetState and Snapshot::Create.
  //         Each is kept as last_error too.
  ptc::Status Adopt(const std::function<ptc::Status(ptc::Store&)>& write) EXCLUDES(mu_, collect_mu_);

  // The status document (docs/mount_format.md).
  // Bad bytes (invalid UTF-8 in last_error or a path) are replaced, never thrown.
  // `passthrough`, when not null, is shown as the field "passthrough".
  std::string StatusJson(const std::shared_ptr<const Snapshot>& current,
                         const nlohmann::json& passthrough = nullptr) const EXCLUDES(mu_);
  // Keeps `error` as last_error, cut to kMaxLastError bytes (the next commit clears it).
  void RecordError(const std::string& error) EXCLUDES(mu_);

  // collect_ now, unless a rewrite or save runs (its commit collects then):
  // after the last file of a replaced generation was closed, and at unmount.
  void CollectIfIdle() EXCLUDES(mu_, collect_mu_);

  // The most bytes of last_error kept; longer ones end in "... (N bytes cut)".
  static constexpr size_t kMaxLastError = 4096;

 private:
  ptc::Status Start(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                    std::shared_ptr<AgreedChange> change) EXCLUDES(mu_);
  // `source`: what a cluster change reads (controller.cc), nullopt: the
  // store's current generation. `previous`: the snapshot served before,
  // served again when a cluster change fails.
  void Rewrite(const ptc::ModelLayout& layout, std::optional<ptc::DatasetState> dataset,
               std::shared_ptr<AgreedChange> change, std::optional<ChangeSource> source,
               std::shared_ptr<const Snapshot> previous) EXCLUDES(mu_);
  // A save alone (Ingest without a job) and this worker's part of a
  // cluster's (Ingest and ApplySave), with the writer role held.
  ptc::Status Save(const std::string& staging_root, uint64_t iteration, const std::shared_ptr<const Snapshot>& current)
      EXCLUDES(mu_, collect_mu_);
  // A Megatron-Core torch_dist save (iter_dir holds metadata.json): its DCP
  // files in Megatron-Core's keys (ptc/checkpoint/dcp/read.h) in the current
  // config, its common.pt's args and iteration, committed as Save does.
  ptc::Status SaveTorchDist(const std::string& iter_dir, uint64_t iteration,
                            const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_, collect_mu_);
  // What a torch_dist save's common.pt makes of the manifest: the store's
  // Megatron state at `iteration` with the save's args, and the data position.
  struct TorchDistState {
    nlohmann::json extra;
    std::optional<ptc::DatasetState> dataset;
  };
  ptc::Result<TorchDistState> ReadTorchDistState(const std::string& iter_dir, uint64_t iteration,
                                                 const std::shared_ptr<const Snapshot>& current);
  // A DCP save (`dir`, `save` its name in the staging area; a torch_dist
  // save's iteration with its `state`) whose commit point was on this mount
  // of a cluster job: proposed to the job with its .metadata, this worker's
  // part run here (SaveDcpInCluster); on an error the job is told.
  ptc::Status ProposeDcpSave(const std::string& dir, const std::string& save, ptc::dcp::Keys keys,
                             const TorchDistState* state, const std::shared_ptr<const Snapshot>& current,
                             JobParticipant& job, const std::function<void()>& committed) EXCLUDES(mu_, collect_mu_);
  // The DCP checkpoint in `dir` (keys as `keys` says) committed in the current
  // config with `extra` and `dataset`; `committed` runs before it is served.
  ptc::Status CommitDcp(const std::string& dir, ptc::dcp::Keys keys, nlohmann::json extra,
                        std::optional<ptc::DatasetState> dataset, const std::shared_ptr<const Snapshot>& current,
                        const std::function<void()>& committed) EXCLUDES(mu_, collect_mu_);
  ptc::Status SaveInCluster(const std::string& staging_root, uint64_t iteration,
                            const std::shared_ptr<const Snapshot>& current, AgreedChange& change)
      EXCLUDES(mu_, collect_mu_);
  // This worker's part of a DCP save on many workers (ProposeDcpSave,
  // ApplyDcpSave); `committed` runs after the commit,
  // before it is served. `state`: the proposer's of a torch_dist save
  // (published in its part: every worker commits it).
  ptc::Status SaveDcpInCluster(const std::string& dir, const std::string& metadata, ptc::dcp::Keys keys,
                               const TorchDistState* state, const std::shared_ptr<const Snapshot>& current,
                               AgreedChange& change, const std::function<void()>& committed) EXCLUDES(mu_, collect_mu_);
  // Serves a save's committed generation and removes what it replaced.
  void Commit(const std::shared_ptr<const Snapshot>& snap) EXCLUDES(mu_, collect_mu_);
  // On the rewrite's thread after its commit of `layout`: measures the served
  // generation's fragmentation and compacts it when the policy says so.
  void MaybeCompact(const ptc::ModelLayout& layout, const std::optional<ptc::DatasetState>& dataset)
      EXCLUDES(mu_, collect_mu_);
  // ApplyCompaction's thread.
  void CompactInCluster(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                        const std::shared_ptr<AgreedChange>& change) EXCLUDES(mu_, collect_mu_);
  // Writes `planned` (its covering; with `files`, into those rank files) and
  // commits it (`before_commit`: a cluster's), as the running compaction
  // (progress in the status, lowest CPU priority, one thread, cancelled by a
  // writer); returns the snapshot of the committed generation in `layout`.
  ptc::Result<std::shared_ptr<const Snapshot>> RunCompaction(
      const ptc::transform::Compaction& planned, std::vector<ptc::RankFileSpec> files, const ptc::ModelLayout& layout,
      const std::optional<ptc::DatasetState>& dataset, std::function<ptc::Status(ptc::GenerationWriter&)> before_commit)
      EXCLUDES(mu_);
  // After RunCompaction: serves the new generation, measures it and says
  // done, or cancelled (a writer took the role, or `aborted`: the job
  // aborted it) / failed (`what` names it in last_error); the reason is kept
  // as the status's compaction "why". Removes what it replaced. `mode`: how
  // the new generation is measured.
  void EndCompaction(const ptc::Result<std::shared_ptr<const Snapshot>>& result, const std::string& what,
                     ptc::transform::CommitMode mode, bool aborted) EXCLUDES(mu_, collect_mu_);
  // Takes the store's writer role for `state` (a rewrite, a save or an
  // adopted generation; a rewrite also starts with no error and no
  // progress): no other writer starts until the state leaves it. Then joins
  // the background thread (a finished rewrite may still be removing what it
  // replaced, or compacting) and waits out a removal after a close. Returns
  // the state before.
  // \error FailedPrecondition `busy` while another writer holds the role.
  ptc::Result<MountState> BeginWriting(MountState state, const std::string& busy) EXCLUDES(mu_, collect_mu_);
  // Stops a running compaction (a compaction of the job: its change aborted,
  // kCompactionGivesWay) and joins `previous`, the background thread; the
  // caller then is the store's writer. The caller has set state_ to its own
  // state first (so that no compaction starts after this).
  void JoinBackground(std::thread previous) EXCLUDES(mu_);
  // collect_, its error kept as last_error.
  void Collect() EXCLUDES(mu_, collect_mu_);
  // Collect, or nothing when `only_when_idle` and a rewrite or save runs.
  void Collect(bool only_when_idle) EXCLUDES(mu_, collect_mu_);
  void SetLastError(const std::string& error) REQUIRES(mu_);
  // A rewrite, save or Adopt holds the store's writer role.
  bool Writing() const REQUIRES(mu_) {
    return state_ == MountState::kRepartitioning || state_ == MountState::kSaving || state_ == MountState::kRejoining;
  }

  ptc::Store* store_;
  const int worker_;
  const int threads_;
  const CompactionPolicy compaction_;
  const std::shared_ptr<ShardChecks> checks_;
  const std::shared_ptr<const ptc::DatasetSource> source_;
  std::function<void(std::shared_ptr<const Snapshot>)> serve_;
  std::function<ptc::Status()> collect_;
  JobParticipant* job_ GUARDED_BY(mu_) = nullptr;  // a cluster worker's job (SetParticipant)
  // Lock order: collect_mu_, then mu_. Held while removing replaced
  // generations; a rewrite or save takes it (after setting state_) before it
  // writes, so a removal never meets a writer.
  ptc::Mutex collect_mu_;
  mutable ptc::Mutex mu_;
  MountState state_ GUARDED_BY(mu_) = MountState::kServing;
  std::string last_error_ GUARDED_BY(mu_);
  std::string earlier_error_ GUARDED_BY(mu_);  // a failure a later event resolved (Recovered)
  std::thread worker_thread_ GUARDED_BY(mu_);
  std::atomic<uint64_t> done_{0}, total_{0};
  // The background compaction: none | running | done | cancelled | failed,
  // the served generation's fragmentation when last measured, progress.
  std::string compaction_state_ GUARDED_BY(mu_) = "none";
  ptc::transform::Fragmentation fragmentation_ GUARDED_BY(mu_);
  std::string compaction_why_ GUARDED_BY(mu_);  // why the last one was cancelled or failed
  std::atomic<bool> cancel_compaction_{false};
  // The compaction of the job this mount runs (ApplyCompaction), until it ends.
  std::shared_ptr<AgreedChange> compacting_ GUARDED_BY(mu_);
  std::atomic<uint64_t> compact_done_{0}, compact_total_{0};
};

}  // namespace ptcfs
