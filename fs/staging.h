// Where saves written into the mount's megatron/ tree wait until they are
// committed: a real directory (STORE/ingest/) mirroring the paths written
// under megatron/ (iter_0000200/mp_rank_00_000/model_optim_rng.pt). Writes go
// straight to these files; nothing here interprets them (Controller::Ingest
// does, when latest_checkpointed_iteration.txt names an iteration).
//
// Paths are relative to the staging root and come from the FUSE layer one
// name at a time, so they never hold "..": Join rejects such names anyway.
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
  explicit Staging(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string Path(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }
  // `parent` + "/" + `name`. \error InvalidArgument for "", ".", ".." or a name with '/'.
  static ptc::Result<std::string> Join(const std::string& parent, const std::string& name);

  // Each \error is ErrnoError naming the path (EEXIST, ENOENT, ENOTEMPTY, ...).
  ptc::Status Mkdir(const std::string& rel);                 // creates the root first when needed
  // An fd of a regular file (O_CREAT: mode 0644), opened without blocking: any
  // other type (a FIFO) is an IOError "PATH: not a regular file (a FIFO)".
  ptc::Result<int> Open(const std::string& rel, int flags);
  ptc::Result<struct stat> Stat(const std::string& rel) const;
  ptc::Status Rename(const std::string& from, const std::string& to);
  ptc::Status Unlink(const std::string& rel);
  ptc::Status Rmdir(const std::string& rel);
  ptc::Status Truncate(const std::string& rel, uint64_t size);
  ptc::Status RemoveTree(const std::string& rel);
  // Entries of a directory: (name, is a directory); empty when it does not exist.
  std::vector<std::pair<std::string, bool>> List(const std::string& rel) const;

 private:
  std::string root_;
};

}  // namespace ptcfs
