// Mounting: runs the FUSE session for a Filesystem until it is unmounted.
#pragma once

#include <string>

#include "fs/filesystem.h"

namespace ptcfs {

struct SessionOptions {
  std::string mountpoint;
  bool foreground = false;  // otherwise daemonize once mounted
  int threads = 8;          // FUSE worker threads
};

// Opens the store, mounts it and serves until unmounted (or SIGINT/SIGTERM).
// Errors before the mount (bad store, bad mountpoint) are returned and
// nothing is mounted.
// \error as Filesystem::Create; IOError when the mount fails.
ptc::Status MountAndServe(const MountOptions& options, const SessionOptions& session);

}  // namespace ptcfs
