// FUSE passthrough (Linux >= 6.9): an open file whose bytes exist verbatim in
// a file on disk (a rank file, view/rank_files.h) is read by the kernel from that
// backing file itself; no byte crosses /dev/fuse. The daemon registers the
// backing file (FUSE_DEV_IOC_BACKING_OPEN, which needs CAP_SYS_ADMIN) and
// answers OPEN with its id (fs/fuse_io.h patches what libfuse 3.14 cannot say).
// Every other file, and every file when passthrough is off (forced, not root,
// or a kernel without it), is served by the daemon.
//
// The kernel lets one inode have one backing file: the id is registered on the
// first passthrough open of an inode and closed after its last release.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ptc/base/mutex.h"
#include "ptc/base/status.h"

namespace ptcfs {

// The connection's backing-file registry (the seam tests replace).
class BackingDevice {
 public:
  virtual ~BackingDevice() = default;
  // Registers the open file `fd`; returns its backing id (> 0).
  // \error PermissionDenied without CAP_SYS_ADMIN (or before the INIT reply
  //        turned passthrough on); IOError naming the errno otherwise.
  virtual ptc::Result<int32_t> Open(int fd) = 0;
  virtual void Close(int32_t id) = 0;
};

// The ioctls on `dev_fd`, the session's /dev/fuse descriptor (not owned).
std::unique_ptr<BackingDevice> FuseBackingDevice(int dev_fd);

class Passthrough {
 public:
  // wanted = false: --passthrough off, every file through the daemon.
  explicit Passthrough(bool wanted);

  // The kernel's INIT request was read: whether it offers passthrough.
  // Returns whether the reply turns it on (wanted, offered, and the process
  // may register backing files).
  bool OnInit(uint64_t unique, bool kernel_offers) EXCLUDES(mu_);
  // The unique id of the INIT request (its reply is patched), or 0.
  uint64_t init_unique() const EXCLUDES(mu_);
  bool init_enabled() const EXCLUDES(mu_);
  void SetDevice(std::unique_ptr<BackingDevice> device) EXCLUDES(mu_);

  // Whether an open may ask for passthrough now.
  bool enabled() const EXCLUDES(mu_);
  // "on", or "off: " and why.
  std::string State() const EXCLUDES(mu_);

  // The backing id of inode `ino`: registers `fd` on its first open, else
  // another reference to the id registered. A PermissionDenied turns
  // passthrough off for the mount (State says why).
  // \error as BackingDevice::Open; FailedPrecondition when not enabled.
  ptc::Result<int32_t> Acquire(uint64_t ino, int fd) EXCLUDES(mu_);
  // Drops a reference taken by Acquire; the last closes the id.
  void Release(uint64_t ino) EXCLUDES(mu_);
  // Inodes with a registered backing file (open through the kernel).
  size_t backed() const EXCLUDES(mu_);

 private:
  mutable ptc::Mutex mu_;
  const bool wanted_;
  bool enabled_ GUARDED_BY(mu_) = false;
  uint64_t init_unique_ GUARDED_BY(mu_) = 0;
  std::string off_reason_ GUARDED_BY(mu_);
  std::unique_ptr<BackingDevice> device_ GUARDED_BY(mu_);
  struct Backing {
    int32_t id = 0;
    uint64_t refs = 0;
  };
  std::map<uint64_t, Backing> backings_ GUARDED_BY(mu_);
};

// Whether this process may register backing files (CAP_SYS_ADMIN in its
// effective set).
bool MayRegisterBackingFiles();

}  // namespace ptcfs
