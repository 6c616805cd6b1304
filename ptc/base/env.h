// The storage seam, after leveldb's Env: every byte ptcfs reads or writes in
// a store or a checkpoint directory goes through these interfaces, so tests
// can run against memory or inject an I/O error at any chosen operation.
//
// Implementations: PosixEnv (Env::Default()), NewMemEnv(), and the
// FaultInjectionEnv wrapper (fault_injection_env.h). HDF5 writes its own
// metadata through the OS directly (see h5shard.h); the tensor bytes of a
// shard file go through WritableFile::PWrite at the dataset's offset.
//
// Thread safety: Env methods may be called from any thread. A file object is
// used by one thread at a time, except RandomAccessFile::Read, which is safe
// to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"

namespace ptc {

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at offset into dst.
  // \error Corruption when the file ends before offset + n (message names the file).
  // \error IOError when the OS fails.
  virtual Status Read(uint64_t offset, size_t n, void* dst) const = 0;
  virtual uint64_t Size() const = 0;
  // The OS descriptor when there is one (for splice / fuse_reply_data), else -1.
  virtual int fd() const { return -1; }
  // True when every byte Read returns has been checked against the checksum
  // blocks of the manifest record holding it (a file read from another
  // worker, checked on arrival): readers that verify need not hash it again.
  virtual bool VerifiesBlocks() const { return false; }
  virtual const std::string& path() const = 0;
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends at the end of what was written so far.
  virtual Status Append(const void* data, size_t n) = 0;
  // Writes at an absolute offset (the file grows as needed).
  virtual Status PWrite(uint64_t offset, const void* data, size_t n) = 0;
  virtual Status Sync() = 0;   // data and metadata durable (fsync)
  virtual Status Close() = 0;  // idempotent; the destructor closes without reporting
};

// A directory opened once to write a tree of output files in it (an export, a
// synthetic checkpoint) or to prune one (a store's garbage collection). Files
// and subdirectories are made, listed and removed by name, relative to the
// opened directory (POSIX: openat, mkdirat, fstatat, unlinkat), never by a
// path, so no name can climb out of the tree, and a symbolic link found in it
// (planted between a check and the writes, or a directory moved elsewhere and
// linked back) is refused or removed as a link, never followed.
//
// Every \error names the path (the directory's path joined with the name).
class OutputDir {
 public:
  // What an entry is, as lstat(2) sees it: a link is not followed.
  enum class EntryKind { kFile, kDirectory, kLink, kOther };
  struct Entry {
    std::string name;
    EntryKind kind;
  };

  virtual ~OutputDir() = default;
  virtual const std::string& path() const = 0;
  // The entries, sorted by name, without "." and "..".
  // \error IOError from the OS.
  virtual Result<std::vector<Entry>> List() = 0;
  // The existing subdirectory `name`.
  // \error InvalidArgument as CreateDir; PermissionDenied when it is a symbolic
  //        link; NotFound when absent; FailedPrecondition when not a directory.
  virtual Result<std::unique_ptr<OutputDir>> OpenDir(const std::string& name) = 0;
  // Removes the entry `name`: a file, a link (the link itself, never what it
  // points at) or an empty directory.
  // \error InvalidArgument as CreateDir; IOError from the OS (a directory that
  //        is not empty among them).
  virtual Status Remove(const std::string& name) = 0;
  // The subdirectory `name`, made when it does not exist.
  // \error InvalidArgument for "", ".", ".." or a name with '/';
  //        PermissionDenied ("PATH: a symbolic link ...") when it is a symbolic link;
  //        AlreadyExists when it is not a directory; IOError from the OS.
  virtual Result<std::unique_ptr<OutputDir>> CreateDir(const std::string& name) = 0;
  // Creates or truncates the file `name`.
  // \error InvalidArgument and PermissionDenied as CreateDir; IOError from the OS.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& name) = 0;
  // Renames `from` over `to`, both in this directory (an atomic replace; a
  // link at `to` is replaced, not followed).
  // \error InvalidArgument as CreateDir; IOError from the OS.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries durable (fsync).
  virtual Status Sync() = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX implementation. Never deleted.
  static Env* Default();

  // Opens a regular file for reading. POSIX: opened without blocking and
  // checked first (ptc/base/regular_file.h), so a FIFO is refused, never waited on.
  // \error NotFound when `path` does not exist.
  // \error IOError "PATH: not a regular file (a FIFO)" for a FIFO, a device, a directory...; IOError from the OS.
  virtual Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) = 0;
  // Creates or truncates. The last component of `path` is not followed when
  // it is a symbolic link (PermissionDenied naming the path).
  virtual Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) = 0;
  // Opens an existing file for writing without truncating it (to fill the
  // preallocated dataset of an HDF5 shard file).
  // \error NotFound when the file does not exist; IOError as OpenRead when it is not a regular file.
  virtual Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) = 0;

  virtual bool Exists(const std::string& path) = 0;
  // Whether reading `path` can be tried now: false for a file held by a
  // machine known to be gone (a cluster worker whose lease expired), so that
  // a reader with a copy elsewhere takes that one. Local files: true.
  virtual bool Reachable(const std::string& path) { return true; }
  // \error NotFound; IOError as OpenRead when it is not a regular file (a FIFO has no size to read).
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // Names (not paths) of the entries of a directory, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual Status CreateDirs(const std::string& path) = 0;                     // mkdir -p; OK if it exists
  virtual Status Rename(const std::string& from, const std::string& to) = 0;  // atomic replace
  // Makes `to` (which must not exist) a second name of the file `from` (a hard
  // link: no byte copied; writes through either name are seen through both).
  // \error NotFound; AlreadyExists; IOError from the OS (EXDEV across file
  //        systems, EPERM where links are not allowed): a caller may copy instead.
  virtual Status Link(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;                         // a file or an empty directory
  // rm -r, OK if absent: links in the tree (and `path` itself, when a link)
  // are removed as links, never followed.
  virtual Status RemoveTree(const std::string& path) = 0;
  virtual Status SyncDir(const std::string& path) = 0;                        // fsync a directory (after rename)
  // Makes everything written to the file system holding `path` durable
  // (syncfs): one call instead of an fsync per file before a commit.
  virtual Status SyncFileSystem(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Makes `path` (mkdir -p) and opens it to write a tree of files in it.
  // `path` is the caller's: it may be or pass through a symbolic link; within
  // it, nothing is followed (OutputDir).
  // \error as CreateDirs; IOError when it cannot be opened.
  virtual Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) = 0;
  // The memory of this machine in bytes (physical pages): what a command may
  // hold at once at most (ptc/model/limits.h). 0 when it cannot be told.
  virtual uint64_t MemoryBytes();
};

// A fresh, empty in-memory Env. Paths are plain strings; directories exist
// implicitly and explicitly (CreateDirs). fd() is -1 for its files.
std::unique_ptr<Env> NewMemEnv();

// Whole-file helpers on top of any Env.
Result<std::string> ReadFileToString(Env* env, const std::string& path);
// Writes `path.tmp`, syncs it, renames it over `path`, syncs the directory:
// readers see the old or the new content, never a mix, also after a crash.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view contents);
// The same for the file `name` of `dir` (NAME.tmp, renamed over NAME).
Status WriteFileAtomic(OutputDir& dir, const std::string& name, std::string_view contents);
// Whether `name` names one entry of a directory: not "", ".", ".." and no '/'.
// \error InvalidArgument naming `dir`/`name`.
Status CheckEntryName(std::string_view dir, std::string_view name);

// "a/b" + "c" -> "a/b/c"; dirname of "a/b/c" is "a/b".
std::string JoinPath(std::string_view a, std::string_view b);
std::string DirName(std::string_view path);

}  // namespace ptc
