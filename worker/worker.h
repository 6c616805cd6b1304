// A mount that is one worker of a cluster job (docs/cluster.md): the store
// read through a PeerEnv (its own pieces local, the others' from their
// workers), agreed with the job before it mounts, and the Agent that runs
// once it is mounted. The command line (tools/cluster_mount.h) parses the
// options and connects the key-value store; tests give an in-memory one.
//
// Thread safety: Prepare, then env() and Attach from one thread; what
// Attach returns is released before the Worker.
#pragma once

#include <memory>
#include <string>

#include "cluster/coordinator.h"
#include "cluster/kv_store.h"
#include "cluster/peer_env.h"
#include "fs/filesystem.h"
#include "ptc/base/status.h"
#include "worker/worker_options.h"

namespace ptcfs::worker {

class Worker {
 public:
  // Before mounting, so that errors reach the user: reaches the key-value
  // store, opens the store at `store` (an empty directory is a store to be: a
  // worker that joins with a new disk), brings it to the job's committed
  // generation from a peer when it is behind, and agrees its generation with
  // the job's (Coordinator::Join).
  // \error as KvStore (IOError: unreachable), Store::Open, CatchUp, Coordinator::Join;
  //        FailedPrecondition when neither the store nor the job holds a generation.
  static ptc::Result<std::unique_ptr<Worker>> Prepare(WorkerOptions options, std::unique_ptr<ptc::cluster::KvStore> kv,
                                                      const std::string& store);
  ~Worker();

  // The Env to open the store with (MountOptions::env).
  ptc::Env* env() { return env_.get(); }
  const WorkerOptions& options() const { return options_; }

  // In the daemon, once mounted: starts the peer server, joins the job, and
  // the agent (agent.h). What it returns stops them all.
  ptc::Result<std::shared_ptr<void>> Attach(Filesystem& fs);

 private:
  Worker(WorkerOptions options, std::unique_ptr<ptc::cluster::KvStore> kv);

  const WorkerOptions options_;
  const std::unique_ptr<ptc::cluster::KvStore> kv_;
  std::unique_ptr<ptc::cluster::Coordinator> coordinator_;
  std::unique_ptr<ptc::cluster::PeerEnv> env_;
  uint64_t restored_ = 0;       // the generation restored from the durable tier (tier_restore.h); 0: none
  std::string resume_config_;   // the layout its agent then moves the job to; empty: none
};

}  // namespace ptcfs::worker
