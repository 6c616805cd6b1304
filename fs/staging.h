// Where saves written into the mount's megatron/ tree wait until they are
// committed: a real directory (STORE/ingest/) mirroring the paths written
// under megatron/ (iter_0000200/mp_rank_00_000/model_optim_rng.pt). Writes go
// straight to these files; nothing here interprets them (Controller::Ingest
// does, when latest_checkpointed_iteration.txt names an iteration).
//
// Paths are relative to the staging root and come from the FUSE layer one
// name at a time, so they never hold "..": Join rejects such names anyway.
//
// Nothing here follows a symbolic link. The root is opened relative to its
// parent (the store) without following a link at its own name, and every
// path beneath it is resolved from that descriptor with openat2's
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, the last name acted on with the *at
// call that never follows one (unlinkat, mkdirat, renameat, fstatat with
// AT_SYMLINK_NOFOLLOW, openat with O_NOFOLLOW). A link planted at
// STORE/ingest, at STORE/ingest/.dcp or anywhere below makes the operation
// fail (PermissionDenied naming the path) and is never listed, so no save is
// staged, listed or removed outside the store.
//
// Thread safety: the file system serialises nothing; concurrent operations on
// different paths are fine, as with any directory.
#pragma once

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "ptc/base/status.h"

namespace ptcfs {

class Staging {
 public:
  // `root`: the staging directory (STORE/ingest). Its parent is taken as
  // given (links followed: where the store is is the user's choice).
  explicit Staging(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string Path(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }
  // `parent` + "/" + `name`. \error InvalidArgument for "", ".", ".." or a name with '/'.
  static ptc::Result<std::string> Join(const std::string& parent, const std::string& name);

  // Each \error is ErrnoError naming the path (EEXIST, ENOENT, ENOTEMPTY, ...), or
  // PermissionDenied "PATH: a symbolic link ..." when the root or any part of
  // the path is a link.
  ptc::Status Mkdir(const std::string& rel);                 // creates the root first when needed
  // An fd of a regular file (O_CREAT: mode 0644), opened without blocking: any
  // other type (a FIFO) is an IOError "PATH: not a regular file (a FIFO)".
  ptc::Result<int> Open(const std::string& rel, int flags);
  // lstat(2) of the entry (a link is not followed).
  ptc::Result<struct stat> Stat(const std::string& rel) const;
  ptc::Status Rename(const std::string& from, const std::string& to);
  ptc::Status Unlink(const std::string& rel);
  ptc::Status Rmdir(const std::string& rel);
  ptc::Status Truncate(const std::string& rel, uint64_t size);
  // rm -r, OK when absent; a link inside is removed as a link, never followed.
  ptc::Status RemoveTree(const std::string& rel);
  // Entries of a directory that are regular files or directories: (name, is
  // a directory); empty when it does not exist or cannot be opened.
  std::vector<std::pair<std::string, bool>> List(const std::string& rel) const;

 private:
  std::string root_;
};

}  // namespace ptcfs
