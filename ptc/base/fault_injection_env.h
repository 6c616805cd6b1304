// FaultInjectionEnv: an Env that forwards to a base Env and fails a chosen
// mutating operation, so tests can walk every I/O-error path of a protocol
// (after leveldb's db/fault_injection_test.cc).
//
// Counted ("mutating") operations, each one op: OpenWrite, OpenExisting,
// WritableFile::Append, WritableFile::PWrite, WritableFile::Sync, Rename, Link,
// Remove, RemoveTree, CreateDirs, SyncDir; in an OutputDir, as the same kinds:
// OpenOutputDir and CreateDir (CreateDirs), NewWritableFile (OpenWrite),
// Remove, Rename, Sync (SyncDir). Reads, listings and Close are never counted or
// failed. A failed op does nothing in the base Env.
//
// Typical use: for n = 0, 1, 2, ...: FailAfter(n); run the protocol; check the
// invariants; Disarm(); until the protocol succeeds with ops() <= n.
//
// HDF5 does its own file I/O (h5shard.h) and is not seen by this wrapper.
//
// Thread safety: all methods may be called from any thread. Files returned by
// this Env refer to it: the Env must outlive them.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "ptc/base/env.h"
#include "ptc/base/mutex.h"

namespace ptc {

class FaultInjectionEnv final : public Env {
 public:
  enum class Op {
    kOpenWrite,
    kOpenExisting,
    kAppend,
    kPWrite,
    kSync,
    kRename,
    kLink,
    kRemove,
    kRemoveTree,
    kCreateDirs,
    kSyncDir
  };
  static std::string_view OpName(Op op);

  // `base` is not owned and must outlive this Env.
  explicit FaultInjectionEnv(Env* base);

  // Lets the next `n_ops` counted ops succeed, then fails op number n_ops
  // (0-based, counted from this call) and every counted op after it until
  // Disarm(), as a disk that went away would. Resets ops() to 0.
  void FailAfter(int n_ops, Code code = Code::kIOError) EXCLUDES(mu_);
  // Like FailAfter, but only that one op fails; later ops succeed.
  void FailOnceAfter(int n_ops, Code code = Code::kIOError);
  // Restricts counting and failing to Rename and Sync/SyncDir (true), or
  // counts every mutating op (false, the default). Resets ops() to 0.
  void SetOnlyRenameAndSync(bool only);
  // Stops failing. ops() keeps counting.
  void Disarm();

  // Counted ops since the last FailAfter / FailOnceAfter / SetOnlyRenameAndSync / construction.
  int ops() const;
  // Number of ops failed since construction.
  int failures() const;

  Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) override;
  bool Exists(const std::string& path) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  Status CreateDirs(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status RemoveTree(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status SyncFileSystem(const std::string& path) override;  // counted as a kSync
  bool IsDirectory(const std::string& path) override;
  Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) override;

  // Counts one op of kind `op` on `path`; returns the injected error when it
  // must fail. Used by the wrapped files; not for callers.
  Status MaybeFail(Op op, const std::string& path) EXCLUDES(mu_);

 private:
  Env* const base_;
  mutable Mutex mu_;
  bool armed_ GUARDED_BY(mu_) = false;
  bool sticky_ GUARDED_BY(mu_) = true;
  bool only_rename_sync_ GUARDED_BY(mu_) = false;
  int fail_at_ GUARDED_BY(mu_) = 0;
  int ops_ GUARDED_BY(mu_) = 0;
  int failures_ GUARDED_BY(mu_) = 0;
  Code code_ GUARDED_BY(mu_) = Code::kIOError;
};

}  // namespace ptc
