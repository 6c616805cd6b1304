#include "ptc/base/dir_at.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "ptc/base/regular_file.h"

namespace ptc {
namespace {

OutputDir::EntryKind KindOf(mode_t mode) {
  if (S_ISREG(mode)) return OutputDir::EntryKind::kFile;
  if (S_ISDIR(mode)) return OutputDir::EntryKind::kDirectory;
  if (S_ISLNK(mode)) return OutputDir::EntryKind::kLink;
  return OutputDir::EntryKind::kOther;
}

}  // namespace

bool IsLinkAt(int dir, const std::string& name) {
  struct stat st;
  return ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

int OpenAtRetry(int dir, const std::string& name, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::openat(dir, name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

Status LinkRefusedError(const std::string& path) {
  return Status(Code::kPermissionDenied, path + ": a symbolic link (not followed)");
}

Result<UniqueFd> OpenDirBeneath(int root, std::string_view rel, const std::string& root_path) {
  const int first = ::fcntl(root, F_DUPFD_CLOEXEC, 0);
  if (first < 0) return ErrnoError(root_path + ": open directory", errno);
  UniqueFd dir(first);
  std::string path = root_path;
  while (!rel.empty()) {
    const size_t slash = rel.find('/');
    const std::string name(rel.substr(0, slash));
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(slash + 1);
    PTC_RETURN_IF_ERROR(CheckEntryName(path, name));
    path = JoinPath(path, name);
    const int fd = OpenAtRetry(dir.get(), name, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      const int err = errno;
      if (IsLinkAt(dir.get(), name)) return LinkRefusedError(path);
      if (err == ENOTDIR) return FailedPreconditionError(path + ": not a directory");
      return ErrnoError(path + ": open directory", err);
    }
    dir = UniqueFd(fd);
  }
  return dir;
}

Result<UniqueFd> OpenRegularFileAt(int dir, const std::string& name, int flags, const std::string& path) {
  PTC_RETURN_IF_ERROR(CheckEntryName(DirName(path), name));
  const int raw = OpenAtRetry(dir, name, flags | O_NONBLOCK | O_NOCTTY, 0644);
  if (raw < 0) {
    const int err = errno;
    struct stat st;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISLNK(st.st_mode)) return LinkRefusedError(path);
      // O_WRONLY|O_NONBLOCK of a FIFO without a reader, or of a socket: ENXIO.
      if ((err == ENXIO || err == EISDIR) && !S_ISREG(st.st_mode)) return NotRegularFileError(path, st.st_mode);
    }
    return ErrnoError(path, err);
  }
  UniqueFd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(path + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) return NotRegularFileError(path, st.st_mode);
  if ((flags & O_NONBLOCK) == 0) {
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) return ErrnoError(path + ": fcntl", errno);
  }
  return fd;
}

Result<std::vector<OutputDir::Entry>> ListAt(int fd, const std::string& path) {
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoError(path + ": list directory", errno);
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    return ErrnoError(path + ": list directory", err);
  }
  ::rewinddir(dir);
  std::vector<OutputDir::Entry> entries;
  int err = 0;
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      err = errno;
      break;
    }
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed meanwhile
      err = errno;
      break;
    }
    entries.push_back({std::move(name), KindOf(st.st_mode)});
  }
  ::closedir(dir);
  if (err != 0) return ErrnoError(path + ": list directory", err);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return entries;
}

Status RemoveTreeAt(int dir, const std::string& name, const std::string& path) {
  struct stat st;
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? Status::OK() : ErrnoError(path + ": remove tree", errno);
  if (S_ISDIR(st.st_mode)) {
    const int fd = OpenAtRetry(dir, name, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ErrnoError(path + ": remove tree", errno);
    Result<std::vector<OutputDir::Entry>> entries = ListAt(fd, path);
    Status s = entries.status();
    for (size_t i = 0; s.ok() && i < entries->size(); ++i) {
      s = RemoveTreeAt(fd, (*entries)[i].name, JoinPath(path, (*entries)[i].name));
    }
    ::close(fd);
    PTC_RETURN_IF_ERROR(s);
  }
  if (::unlinkat(dir, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT)
    return ErrnoError(path + ": remove", errno);
  return Status::OK();
}

}  // namespace ptc
