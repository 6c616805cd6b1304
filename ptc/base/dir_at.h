// File operations relative to an open directory that never follow a symbolic
// link: the POSIX *at calls (openat with O_NOFOLLOW, fstatat with
// AT_SYMLINK_NOFOLLOW, unlinkat), so that no name in a tree ptcfs owns (an
// output tree, a store's staging area) can lead a write or a removal out of
// it. PosixOutputDir and the mount's Staging are built on these.
//
// Every \error names `path`, the caller's spelling of the entry for messages.
//
// Thread safety: plain functions of their descriptors, safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc {

// Owns a descriptor (closed on destruction, never twice); -1 when empty.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// openat(2) of `name` in `dir` with O_CLOEXEC | O_NOFOLLOW added, retried on EINTR; -1 and errno on failure.
int OpenAtRetry(int dir, const std::string& name, int flags, mode_t mode = 0);

// Whether `name` in the directory open as `dir` is a symbolic link (lstat).
bool IsLinkAt(int dir, const std::string& name);

// The PermissionDenied error for a link met at `path`: "PATH: a symbolic link (not followed)".
Status LinkRefusedError(const std::string& path);

// The directory `rel` ("a/b/c", "" for `root` itself) beneath the directory
// open as `root`, walked one name at a time with O_NOFOLLOW: a link at any
// name, "..", "." or an empty name is refused, so the result is inside root.
// \error PermissionDenied naming the link's path (`root_path`/prefix) when a
//        name is a symbolic link; InvalidArgument for a name that is not one;
//        NotFound when a name is absent; IOError from the OS.
Result<UniqueFd> OpenDirBeneath(int root, std::string_view rel, const std::string& root_path);

// A regular file `name` of `dir` opened with `flags` (O_CREAT makes mode
// 0644) without blocking and without following a link, O_NONBLOCK cleared
// after: as OpenRegularFile (ptc/base/regular_file.h), relative to `dir`.
// \error PermissionDenied when `name` is a link; NotFound; IOError "PATH: not
//        a regular file (a FIFO)" for any other type; IOError from the OS.
Result<UniqueFd> OpenRegularFileAt(int dir, const std::string& name, int flags, const std::string& path);

// The entries of the directory open as `fd` (not consumed), sorted by name,
// each lstat'ed relative to it (an entry removed meanwhile is left out).
// \error IOError from the OS.
Result<std::vector<OutputDir::Entry>> ListAt(int fd, const std::string& path);

// rm -r of `name` in the directory open as `dir`, by descriptors: a link is
// unlinked, never followed, and no path is resolved twice. OK if absent.
// \error IOError from the OS (the first failure; what could be removed is).
Status RemoveTreeAt(int dir, const std::string& name, const std::string& path);

}  // namespace ptc
