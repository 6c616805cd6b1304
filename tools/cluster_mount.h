// `ptcfs mount --cluster`: the command line of a mount that is one worker of
// a cluster job (docs/cluster.md); the worker itself is worker/worker.h.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "ptc/base/status.h"
#include "worker/worker.h"

namespace ptcfs {

struct ClusterArgs {
  std::string url;         // etcd://HOST:PORT[,HOST:PORT...]/JOB
  std::string listen;      // HOST:PORT the peer server binds; the others reach it there
  std::string token_file;  // the job's shared token (mode 0600)
  int lease_seconds = 10;  // a worker silent this long has left the job
  int timeout_seconds = 600;
  std::string durable;     // the job's durable tier (a directory every worker sees); empty: none
};

struct ClusterUrl {
  std::vector<std::string> endpoints;  // HOST:PORT
  std::string job;
};
// \error InvalidArgument naming the text when it is not etcd://HOST:PORT[,...]/JOB.
ptc::Result<ClusterUrl> ParseClusterUrl(std::string_view text);

// `ptcfs cluster status` (cmd_cluster.cc), added with the mount commands.
void AddClusterCommand(CLI::App& app, int* exit_code);

// The worker a `ptcfs mount --cluster` runs (worker/worker.h), its
// arguments checked and etcd reached before mounting, so that errors reach
// the user.
// \error as ParseClusterUrl, ReadTokenFile, EtcdClient::Health, Worker::Prepare;
//        InvalidArgument for a missing --worker or --token-file, a wildcard --listen.
ptc::Result<std::unique_ptr<worker::Worker>> PrepareClusterWorker(const ClusterArgs& args, const std::string& store,
                                                                  int worker);

}  // namespace ptcfs
