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
#include <string>
#include <thread>

#include "fs/snapshot.h"
#include "ptc/base/mutex.h"
#include "ptc/store/store.h"

namespace ptcfs {

class Controller {
 public:
  // `serve` installs a snapshot as the one the mount shows; `collect` removes
  // the generations a committed one replaced (called once the state says
  // serving again: cleanup is not part of the wait). `checks`: the mount's
  // shard verifications. `source`: the store's opened dataset, or null when
  // it has none.
  Controller(ptc::Store* store, int worker, int threads, std::shared_ptr<ShardChecks> checks,
             std::shared_ptr<const ptc::DatasetSource> source,
             std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect);
  ~Controller();  // waits for a running rewrite

  // Parses "tp=4,pp=1" or {"config": "tp=4,pp=1", "step": S, "epoch": E},
  // validates it against the model (and the step against the dataset),
  // switches the layout and data position and starts the rewrite, which
  // commits the new dataset position with the new layout.
  // \error InvalidArgument naming what is wrong (also kept as last_error);
  // \error FailedPrecondition while a rewrite runs.
  ptc::Status Reconfigure(const std::string& text, const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_);

  // Commits the Megatron save of `iteration` staged under `staging_root`
  // (megatron/ writes, fs/staging.h) as a new generation, in the current
  // config with the save's tp and pp, and serves it. Blocks until committed;
  // on any error the current generation stays (also kept as last_error).
  // \error FailedPrecondition while a rewrite runs; InvalidArgument with
  //        zero=1 (Megatron's files do not hold ZeRO-1 state); as
  //        OpenMegatronCheckpoint and ImportInto (a missing rank names it).
  ptc::Status Ingest(const std::string& staging_root, uint64_t iteration,
                     const std::shared_ptr<const Snapshot>& current) EXCLUDES(mu_);

  // The status document (docs/mount_format.md).
  // Bad bytes (invalid UTF-8 in last_error or a path) are replaced, never thrown.
  std::string StatusJson(const std::shared_ptr<const Snapshot>& current) const EXCLUDES(mu_);
  // Keeps `error` as last_error, cut to kMaxLastError bytes (the next commit clears it).
  void RecordError(const std::string& error) EXCLUDES(mu_);

  // collect_ now, unless a rewrite or save runs (its commit collects then):
  // after the last file of a replaced generation was closed, and at unmount.
  void CollectIfIdle() EXCLUDES(mu_, collect_mu_);

  // The most bytes of last_error kept; longer ones end in "... (N bytes cut)".
  static constexpr size_t kMaxLastError = 4096;

 private:
  void Rewrite(ptc::ParallelConfig config, ptc::ModelSpec spec, std::optional<ptc::DatasetState> dataset) EXCLUDES(mu_);
  // collect_, its error kept as last_error.
  void Collect() EXCLUDES(mu_, collect_mu_);
  // Collect, or nothing when `only_when_idle` and a rewrite or save runs.
  void Collect(bool only_when_idle) EXCLUDES(mu_, collect_mu_);
  void SetLastError(const std::string& error) REQUIRES(mu_);

  ptc::Store* store_;
  const int worker_;
  const int threads_;
  const std::shared_ptr<ShardChecks> checks_;
  const std::shared_ptr<const ptc::DatasetSource> source_;
  std::function<void(std::shared_ptr<const Snapshot>)> serve_;
  std::function<ptc::Status()> collect_;
  // Lock order: collect_mu_, then mu_. Held while removing replaced
  // generations; a rewrite or save takes it (after setting state_) before it
  // writes, so a removal never meets a writer.
  ptc::Mutex collect_mu_;
  mutable ptc::Mutex mu_;
  std::string state_ GUARDED_BY(mu_) = "serving";  // serving | repartitioning | saving | failed
  std::string last_error_ GUARDED_BY(mu_);
  std::thread worker_thread_ GUARDED_BY(mu_);
  std::atomic<uint64_t> done_{0}, total_{0};
};

}  // namespace ptcfs
