// Env::Default(): the POSIX implementation. Every call retries on EINTR and
// loops over short reads and writes; errors name the path. Every descriptor is
// O_CLOEXEC; files are created with O_NOFOLLOW, and output trees through
// descriptors of their directories (PosixOutputDir).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ptc/base/dir_at.h"
#include "ptc/base/env.h"
#include "ptc/base/regular_file.h"

namespace ptc {
namespace {

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status Read(uint64_t offset, size_t n, void* dst) const override {
    char* out = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return ErrnoError(path_ + ": read of " + std::to_string(n) + " bytes at " + std::to_string(offset), errno);
      if (r == 0) {
        return CorruptionError(path_ + ": unexpected end of file reading " + std::to_string(n) + " bytes at offset " +
                               std::to_string(offset) + " (file size " + std::to_string(Size()) + ")");
      }
      done += static_cast<size_t>(r);
    }
    return Status::OK();
  }

  uint64_t Size() const override {
    struct stat st;
    return ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  int fd() const override { return fd_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, uint64_t pos) : path_(std::move(path)), fd_(fd), pos_(pos) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Append(const void* data, size_t n) override {
    PTC_RETURN_IF_ERROR(PWrite(pos_, data, n));
    pos_ += n;
    return Status::OK();
  }

  Status PWrite(uint64_t offset, const void* data, size_t n) override {
    if (fd_ < 0) return FailedPreconditionError(path_ + ": write after close");
    const char* in = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::pwrite(fd_, in + done, n - done, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0)
        return ErrnoError(path_ + ": write of " + std::to_string(n) + " bytes at " + std::to_string(offset), errno);
      done += static_cast<size_t>(w);
    }
    return Status::OK();
  }

  Status Sync() override {
    if (fd_ < 0) return FailedPreconditionError(path_ + ": sync after close");
    if (::fsync(fd_) != 0) return ErrnoError(path_ + ": fsync", errno);
    return Status::OK();
  }

  Status Close() override {
    if (fd_ < 0) return Status::OK();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0 && errno != EINTR) return ErrnoError(path_ + ": close", errno);
    return Status::OK();
  }

 private:
  std::string path_;
  int fd_;
  uint64_t pos_;
};

int OpenRetry(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

Status LinkRefused(const std::string& path) {
  return Status(Code::kPermissionDenied, path + ": a symbolic link (output files are never written through links)");
}

// A directory of an output tree, by descriptor: entries are made with
// mkdirat/openat relative to it, links never followed (O_NOFOLLOW), files
// created new (O_EXCL: not a link, a hard link or a FIFO planted there).
class PosixOutputDir final : public OutputDir {
 public:
  PosixOutputDir(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixOutputDir() override { ::close(fd_); }

  const std::string& path() const override { return path_; }

  Result<std::unique_ptr<OutputDir>> CreateDir(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    if (::mkdirat(fd_, name.c_str(), 0755) != 0 && errno != EEXIST)
      return ErrnoError(path + ": create directory", errno);
    const int fd = OpenAtRetry(fd_, name, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      const int err = errno;
      if (IsLinkAt(fd_, name)) return LinkRefused(path);
      if (err == ENOTDIR) return AlreadyExistsError(path + ": exists and is not a directory");
      return ErrnoError(path + ": open directory", err);
    }
    return std::unique_ptr<OutputDir>(new PosixOutputDir(path, fd));
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    const int fd = OpenAtRetry(fd_, name, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
      const int err = errno;
      if (IsLinkAt(fd_, name)) return LinkRefused(path);
      if (err == EEXIST) return AlreadyExistsError(path + ": exists (output files are created, never overwritten)");
      return ErrnoError(path + ": create", err);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, 0));
  }

  Result<std::vector<Entry>> List() override { return ListAt(fd_, path_); }

  Result<std::unique_ptr<OutputDir>> OpenDir(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    const int fd = OpenAtRetry(fd_, name, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      const int err = errno;
      if (IsLinkAt(fd_, name)) return LinkRefusedError(path);
      if (err == ENOENT) return NotFoundError(path + ": no such directory");
      if (err == ENOTDIR) return FailedPreconditionError(path + ": not a directory");
      return ErrnoError(path + ": open directory", err);
    }
    return std::unique_ptr<OutputDir>(new PosixOutputDir(path, fd));
  }

  Status Remove(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    struct stat st;
    if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return ErrnoError(JoinPath(path_, name) + ": remove", errno);
    if (::unlinkat(fd_, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0)
      return ErrnoError(JoinPath(path_, name) + ": remove", errno);
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, from));
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, to));
    if (::renameat(fd_, from.c_str(), fd_, to.c_str()) != 0) {
      return ErrnoError("rename " + JoinPath(path_, from) + " -> " + JoinPath(path_, to), errno);
    }
    return Status::OK();
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoError(path_ + ": fsync directory", errno);
    return Status::OK();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  // Regular files only, opened without blocking (regular_file.h): a FIFO
  // planted as a shard or an input is refused, never waited on.
  Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) override {
    PTC_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, O_RDONLY, "open for reading"));
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd));
  }

  Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) override {
    int fd = OpenRetry(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0) return errno == ELOOP ? LinkRefused(path) : ErrnoError(path + ": open for writing", errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, 0));
  }

  // Append continues at the current end of the file.
  // A regular file only, as OpenRead (a FIFO's write end would wait for a reader).
  Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) override {
    PTC_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, O_WRONLY, "open existing for writing"));
    struct stat st;
    uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, size));
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(path + ": stat", errno);
    if (!S_ISREG(st.st_mode)) return NotRegularFileError(path, st.st_mode);  // a FIFO has no size to read
    return static_cast<uint64_t>(st.st_size);
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoError(path + ": list directory", errno);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
    }
    int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoError(path + ": list directory", err);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return ErrnoError(path + ": create directories", ec.value());
    if (!IsDirectory(path)) return AlreadyExistsError(path + ": exists and is not a directory");
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError("rename " + from + " -> " + to, errno);
    return Status::OK();
  }

  Status Link(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0) return ErrnoError("link " + from + " -> " + to, errno);
    return Status::OK();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0) return Status::OK();
    if (errno == EISDIR || errno == EPERM) {
      if (::rmdir(path.c_str()) == 0) return Status::OK();
    }
    return ErrnoError(path + ": remove", errno);
  }

  Status RemoveTree(const std::string& path) override {
    std::string_view trimmed = path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
    const std::string name(trimmed.substr(trimmed.rfind('/') + 1));  // npos + 1 == 0
    const int dir = OpenRetry(DirName(path), O_RDONLY | O_DIRECTORY);
    if (dir < 0) return errno == ENOENT ? Status::OK() : ErrnoError(path + ": remove tree", errno);
    Status s = name.empty() || name == "." || name == ".."
                   ? InvalidArgumentError(path + ": remove tree: not a name in a directory")
                   : RemoveTreeAt(dir, name, path);
    ::close(dir);
    return s;
  }

  Status SyncFileSystem(const std::string& path) override {
    int fd = OpenRetry(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ErrnoError(path + ": open directory for syncfs", errno);
    int rc = ::syncfs(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError(path + ": syncfs", err);
    return Status::OK();
  }

  Status SyncDir(const std::string& path) override {
    int fd = OpenRetry(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ErrnoError(path + ": open directory for fsync", errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError(path + ": fsync directory", err);
    return Status::OK();
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) override {
    PTC_RETURN_IF_ERROR(CreateDirs(path));
    const int fd = OpenRetry(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ErrnoError(path + ": open directory", errno);
    return std::unique_ptr<OutputDir>(new PosixOutputDir(path, fd));
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();
  return env;
}

}  // namespace ptc
