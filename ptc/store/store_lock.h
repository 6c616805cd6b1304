// One writer per store, across processes: STORE/lock (docs/store_format.md, "The writer lock").
//
// Every process that writes a store (import, transform, data import/advance,
// a mount daemon for its whole life) holds the store's StoreLock while it
// reads the root manifest and builds on it. The lock is flock(2) on
// STORE/lock: the kernel drops it when the holder exits, even on kill -9.
// The file holds a one-line description of the holder (pid, command line,
// host, start time) that a refused writer reports; a stale description left
// by a dead holder is overwritten by the next one.
//
// The lock is held per process: a process that holds a store's lock may open
// more Stores of it (HeldByThisProcess). Readers take no lock.
//
// flock goes through the OS, not the Env: like HDF5's shard files (store.h),
// it needs a store on the real filesystem.
//
// Thread safety: Acquire and HeldByThisProcess may be called from any thread;
// one StoreLock object is used by one thread at a time.
#pragma once

#include <string>

#include "ptc/base/status.h"

namespace ptc {

// The file name of the lock in the store directory.
inline constexpr const char kStoreLockName[] = "lock";

struct StoreLockOptions {
  // Who holds it, as a refused writer sees it ("ptcfs transform S --to tp=4");
  // empty: this process's command line.
  std::string holder;
  // Block until the holder lets go instead of failing.
  bool wait = false;
  // Create the store directory (and parents) when it does not exist (a writer
  // that creates the store); otherwise a missing directory is NotFound.
  bool create_dir = false;
  // Rewrite the description with the new pid in a child of fork(2) (a daemon
  // that forks away from its parent and keeps the lock).
  bool follow_fork = false;
};

class StoreLock {
 public:
  // Takes the writer lock of the store at `root`.
  // \error FailedPrecondition when another process holds it (without wait):
  //        "ROOT: locked by pid 1234 (ptcfs mount ROOT /mnt/m, host h, since 2026-...)".
  // \error NotFound when `root` or ROOT/manifest.json does not exist (without
  //        create_dir: nothing is created in a directory that is not a store). IOError from the OS.
  static Result<StoreLock> Acquire(const std::string& root, const StoreLockOptions& options = {});

  // Whether this process holds the lock of the store at `root` (through any StoreLock).
  static bool HeldByThisProcess(const std::string& root);

  // The description in ROOT/lock ("pid 1234 (...)"); "" when empty. It names
  // the last holder, which may be gone: only a failed Acquire proves it lives.
  // \error NotFound when there is no lock file; IOError from the OS or when it
  //        is not a regular file (never waited on, as a FIFO would be).
  static Result<std::string> ReadHolder(const std::string& root);

  StoreLock() = default;
  StoreLock(StoreLock&& other) noexcept;
  StoreLock& operator=(StoreLock&& other) noexcept;
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  ~StoreLock();  // releases (clears the description first)

  bool held() const { return fd_ >= 0; }

 private:
  void Release();
  int fd_ = -1;
  std::string key_;  // the canonical store path
};

}  // namespace ptc
