// Mounting: runs the FUSE session for a Filesystem until it is unmounted.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "fs/filesystem.h"

namespace ptcfs {

struct SessionOptions {
  std::string mountpoint;
  bool foreground = false;  // otherwise daemonize once mounted
  int threads = 8;          // FUSE worker threads
  // Called in the daemon once mounted (after daemonizing, so that its threads
  // run in the daemon), before serving; what it returns lives until the
  // session ends. An error ends the session (unmounted) with that error.
  std::function<ptc::Result<std::shared_ptr<void>>(Filesystem&)> attach;
};

// Opens the store, mounts it and serves until unmounted (or SIGINT/SIGTERM).
// Errors before the mount (bad store, bad mountpoint) are returned and
// nothing is mounted.
// \error as Filesystem::Create; IOError when the mount fails.
ptc::Status MountAndServe(const MountOptions& options, const SessionOptions& session);

}  // namespace ptcfs
