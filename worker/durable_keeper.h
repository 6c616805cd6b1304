// One cluster worker's part in keeping the job's durable tier (--durable;
// docs/cluster.md, "Durable tier"): until the tier holds a copy of the job's
// contents, the worker copies its share of the committed generation into it
// (cluster/durable.h), once per generation (again, after a pause, when the
// copy failed: the tier away), and completes the copy when its share is the
// last. The copy runs on a thread of its own at the lowest CPU
// priority: no change or recovery waits for it.
//
// Thread safety: Look from one thread (the agent's); the destructor stops a
// copy under way (nothing is completed) and joins it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cluster/coordinator.h"
#include "cluster/durable_location.h"
#include "fs/filesystem.h"
#include "ptc/base/env.h"
#include "ptc/base/mutex.h"

namespace ptcfs::worker {

class DurableKeeper {
 public:
  // `env`: the store's (the copy's reads; the tier's writes too when it is a
  // directory; a bucket has an Env of its own); `fs` and `coordinator`
  // outlive the keeper.
  DurableKeeper(ptc::cluster::DurableLocation tier, std::string job, int worker, ptc::Env* env, Filesystem* fs,
                const ptc::cluster::Coordinator* coordinator)
      : tier_(std::move(tier)), job_(std::move(job)), worker_(worker), env_(env), fs_(fs), coordinator_(coordinator) {}
  ~DurableKeeper();

  // While no change is under way and the store is at the job's committed
  // generation, whose contents the tier is not known to hold: starts a round
  // on the keeper's thread that looks at the tier and, when it holds no copy
  // of those contents, copies this worker's share (once per generation, again
  // kRetryAfter after a failure). Errors go to stderr and last_error.
  void Look();

  // .ptcfs/status "cluster"."durable": {"dir" (the directory or s3:// url),
  // "copy": "complete" (the tier holds a copy of the served generation's
  // contents), "copying" (this worker's share is being written), "behind"
  // (the last copy of these contents failed: "error" says why, and it is
  // made again) or "incomplete" (another worker's share is still to come),
  // "complete_generation": the last generation the tier was found to hold a
  // copy of (its contents: an older state after a save; null: none yet)}.
  // Any thread.
  nlohmann::json Report() const;

 private:
  void Copy(std::shared_ptr<const ptc::GenerationManifest> generation, std::string contents);
  // Whether this worker writes the tier's job record (durable_restore.h,
  // kJobRecord) of `generation`: the lowest worker holding a piece of it.
  bool Records(const ptc::GenerationManifest& generation) const;
  // Writes the record of `generation`, whose `contents` the tier's copy
  // holds, once per generation (the round's thread; an error to stderr:
  // the record is an aid to a restore, the copy stands without it).
  void RecordJob(const ptc::GenerationManifest& generation, const std::string& contents);

  // The tier's Env: the bucket's, or the store's for a directory.
  ptc::Env* tier_env() const { return tier_.env ? tier_.env.get() : env_; }

  const ptc::cluster::DurableLocation tier_;
  const std::string job_;
  const int worker_;
  ptc::Env* const env_;
  Filesystem* const fs_;
  const ptc::cluster::Coordinator* const coordinator_;
  // Records that the tier holds a copy of `contents`, which generation
  // `generation` has.
  void Complete(uint64_t generation, const std::string& contents) EXCLUDES(mu_);

  // The contents the tier was last found to hold a copy of (a save's new
  // contents need a new copy, a change of layout does not), and the last
  // generation found to have those contents.
  mutable ptc::Mutex mu_;
  std::string complete_contents_ GUARDED_BY(mu_);
  std::string error_ GUARDED_BY(mu_);  // why the last copy failed; empty once one succeeds
  std::atomic<uint64_t> complete_{0};
  std::atomic<uint64_t> recorded_{0};  // the generation of the job record last written
  std::atomic<bool> busy_{false};     // a round (a look at the tier, maybe a copy) runs on thread_
  std::atomic<bool> copying_{false};
  std::atomic<bool> failed_{false};  // the last copy failed (not stopped): Look makes it again
  std::atomic<bool> stop_{false};
  uint64_t copied_ = 0;  // the last generation whose share was copied (Look's own)
  std::chrono::steady_clock::time_point next_look_;  // Look's own
  std::thread thread_;
};

}  // namespace ptcfs::worker
