// What makes a mount one worker of a cluster job (docs/cluster.md): the
// values `ptcfs mount --cluster` parses, checked by the command line.
#pragma once

#include <chrono>
#include <string>

#include "cluster/durable_location.h"
#include "cluster/peer_protocol.h"
#include "ptc/base/env.h"

namespace ptcfs::worker {

struct WorkerOptions {
  std::string job;
  int worker = 0;
  ptc::cluster::PeerAddress listen;  // this worker's peer server: the address the others reach it at
  std::string token;        // the job's shared token
  int lease_seconds = 10;   // a worker silent this long has left the job
  std::chrono::seconds timeout{600};  // a change not committed by then is aborted
  ptc::cluster::DurableLocation durable;  // the job's durable tier (a directory every worker sees, or a bucket); empty: none
  ptc::Env* base = nullptr;  // the Env under the store's PeerEnv; null: Env::Default()
};

}  // namespace ptcfs::worker
