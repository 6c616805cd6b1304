// What every write of a mount works with (fs/writes/: a relayout, a
// Megatron save, a DCP save, a compaction, an adopted generation): the store
// and how this mount serves it, the store's writer role that the writes take
// in turn, and the status the role reports in .ptcfs/status.
//
// Thread safety: all methods may be called concurrently. Lock order:
// collect_mu_, then mu_ (below the Controller's callers: fs/filesystem.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "fs/participant.h"
#include "fs/writes/compaction_policy.h"
#include "fs/writes/mount_status.h"
#include "ptc/base/mutex.h"
#include "ptc/base/thread_annotations.h"
#include "ptc/store/store.h"
#include "view/snapshot.h"

namespace ptcfs {

// Bytes written of a write (or of a compaction), for .ptcfs/status.
struct WriteProgress {
  std::atomic<uint64_t> done{0}, total{0};
};

class WriteContext {
 public:
  // As Controller's constructor says.
  WriteContext(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
               std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
               std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect);
  ~WriteContext();  // Stop()
  // Cancels a compaction and waits for the background thread (a rewrite, a
  // compaction): once it returns no write of this context serves or reports.
  void Stop() EXCLUDES(mu_);

  ptc::Store& store() const { return *store_; }
  int worker() const { return worker_; }
  int threads() const { return threads_; }
  const CompactionPolicy& compaction_policy() const { return compaction_; }
  bool has_dataset() const { return source_ != nullptr; }

  // A snapshot of `generation` in `layout` as this mount serves it (its
  // worker, shard checks and dataset source). \error as Snapshot::Create.
  ptc::Result<std::shared_ptr<const Snapshot>> MakeSnapshot(std::shared_ptr<const ptc::GenerationManifest> generation,
                                                            ptc::ModelLayout layout,
                                                            std::optional<ptc::DatasetState> dataset) const;
  // The same of the store's current generation.
  ptc::Result<std::shared_ptr<const Snapshot>> MakeSnapshot(ptc::ModelLayout layout,
                                                            std::optional<ptc::DatasetState> dataset) const;
  // Installs `snap` as the one the mount shows.
  void Serve(std::shared_ptr<const Snapshot> snap) const { serve_(std::move(snap)); }

  // Takes the store's writer role for `state` (a rewrite, a save or an
  // adopted generation; a rewrite also starts with no error and no
  // progress): no other writer starts until the state leaves it. Then joins
  // the background thread (a finished rewrite may still be removing what it
  // replaced, or compacting) and waits out a removal after a close. Returns
  // the state before.
  // \error FailedPrecondition `busy` while another writer holds the role.
  ptc::Result<MountState> BeginWriting(MountState state, const std::string& busy) EXCLUDES(mu_, collect_mu_);
  // Gives the role back: state "serving" after `result` ok, else `on_error`
  // with `what` and the error kept as last_error.
  void EndWriting(const ptc::Status& result, MountState on_error, const std::string& what) EXCLUDES(mu_);
  // A write on the caller's thread: BeginWriting(`state`, `busy`), `write`,
  // then EndWriting with the state before on an error. Returns `write`'s
  // status. \error as BeginWriting (nothing kept) and `write`.
  ptc::Status RunHere(MountState state, const std::string& busy, const std::string& what,
                      const std::function<ptc::Status()>& write) EXCLUDES(mu_, collect_mu_);
  // This worker's part of a change of the job, in the background:
  // BeginWriting(`state`), then on the background thread `write`; on its
  // error change->Failed; `after(ok)`; EndWriting (state "failed" on an
  // error). \error as BeginWriting: then change->Failed is called, the error
  // is kept (after `what`) and neither `write` nor `after` runs.
  ptc::Status RunInBackground(MountState state, const std::string& busy, const std::string& what,
                              std::shared_ptr<AgreedChange> change, std::function<ptc::Status(AgreedChange&)> write,
                              std::function<void(bool ok)> after) EXCLUDES(mu_, collect_mu_);
  // REQUIRES: the writer role (BeginWriting). Runs `write` on the
  // background thread, which the next writer joins.
  void StartBackground(std::function<void()> write) EXCLUDES(mu_);
  // Serves a save's committed generation, clears last_error and removes what
  // it replaced.
  void Commit(const std::shared_ptr<const Snapshot>& snap) EXCLUDES(mu_, collect_mu_);
  // Removes the generations a commit replaced, the error kept as last_error;
  // with `only_when_idle`, nothing while a write or compaction runs (its
  // commit removes them).
  void Collect(bool only_when_idle = false) EXCLUDES(mu_, collect_mu_);

  // A compaction of the job (`change`, Controller::ApplyCompaction) runs
  // `compact` on the background thread, after the thread before: state
  // "running", no progress. False, nothing started, while a write or another
  // such compaction runs.
  bool StartCompaction(std::shared_ptr<AgreedChange> change, std::function<void()> compact) EXCLUDES(mu_);
  // Stops a compaction of the job at its next chunk; nothing when none runs.
  void CancelCompaction() EXCLUDES(mu_);
  // Whether the running compaction is to stop (a writer takes the role).
  bool compaction_cancelled() const { return cancel_compaction_.load(); }
  // Whether a write or a compaction of the job runs.
  bool Busy() const EXCLUDES(mu_);

  // `update` with the status, under the lock (it must not call this context).
  void Update(const std::function<void(MountStatus&)>& update) EXCLUDES(mu_);
  // Keeps `error` as last_error (MountStatus::SetLastError).
  void RecordError(const std::string& error) EXCLUDES(mu_);
  // `read` with the status and the job (null when alone), under the lock:
  // `read` must not call this context (the job's StatusPart neither).
  void Read(const std::function<void(const MountStatus&, const JobParticipant*)>& read) const EXCLUDES(mu_);
  // The cluster job this mount is a worker of, or null (Controller::SetParticipant).
  JobParticipant* job() const EXCLUDES(mu_);
  void SetJob(JobParticipant* job) EXCLUDES(mu_);
  // A rewrite's progress and the compaction's.
  WriteProgress& progress() { return progress_; }
  const WriteProgress& progress() const { return progress_; }
  WriteProgress& compaction_progress() { return compaction_progress_; }
  const WriteProgress& compaction_progress() const { return compaction_progress_; }

 private:
  // Stops a running compaction (a compaction of the job: its change aborted,
  // kCompactionGivesWay) and joins `previous`, the background thread; the
  // caller then is the store's writer. The caller has set the state to its
  // own first (so that no compaction starts after this).
  void JoinBackground(std::thread previous) EXCLUDES(mu_);

  ptc::Store* const store_;
  const int worker_;
  const int threads_;
  const CompactionPolicy compaction_;
  const std::shared_ptr<ShardChecks> checks_;
  const std::shared_ptr<const ptc::DatasetSource> source_;
  const std::function<void(std::shared_ptr<const Snapshot>)> serve_;
  const std::function<ptc::Status()> collect_;
  // Held while removing replaced generations; a writer takes it (after
  // setting its state) before it writes, so a removal never meets a writer.
  ptc::Mutex collect_mu_;
  mutable ptc::Mutex mu_;
  MountStatus status_ GUARDED_BY(mu_);
  JobParticipant* job_ GUARDED_BY(mu_) = nullptr;
  std::thread background_ GUARDED_BY(mu_);
  // The compaction of the job this mount runs (StartCompaction), until it ends.
  std::shared_ptr<AgreedChange> compacting_ GUARDED_BY(mu_);
  std::atomic<bool> cancel_compaction_{false};
  WriteProgress progress_, compaction_progress_;
};

}  // namespace ptcfs
