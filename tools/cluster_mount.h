// A mount that is one worker of a cluster (docs/cluster.md): the store read
// through a PeerEnv, this worker's PeerServer and membership in etcd, and the
// agent that applies the job's changes to the mount.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "fs/filesystem.h"
#include "ptc/base/env.h"
#include "ptc/base/status.h"

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

class ClusterMount {
 public:
  // Before mounting, so that errors reach the user: reads the token, reaches
  // etcd, and agrees the store's generation with the job's (Coordinator::Join).
  // \error as ParseClusterUrl, ReadTokenFile, EtcdClient::Health, Coordinator::Join.
  static ptc::Result<std::unique_ptr<ClusterMount>> Prepare(const ClusterArgs& args, const std::string& store,
                                                            int worker);
  ~ClusterMount();

  // The Env to open the store with (MountOptions::env).
  ptc::Env* env();

  // In the daemon, once mounted: starts the peer server, joins the job, and
  // the agent. What it returns stops them all.
  ptc::Result<std::shared_ptr<void>> Attach(Filesystem& fs);

 struct Impl;  // for the agent in the .cc

 private:
  explicit ClusterMount(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptcfs
