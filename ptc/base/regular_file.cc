#include "ptc/base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace ptc {

std::string_view FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "an unknown file type";
}

Status NotRegularFileError(const std::string& path, mode_t mode) {
  return IOError(path + ": not a regular file (" + std::string(FileTypeName(mode)) + ")");
}

Result<int> OpenRegularFile(const std::string& path, int flags, std::string_view what) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    // O_WRONLY|O_NONBLOCK of a FIFO without a reader: ENXIO; of a socket: ENXIO.
    struct stat st;
    if ((err == ENXIO || err == EISDIR) && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotRegularFileError(path, st.st_mode);
    }
    return ErrnoError(what.empty() ? path : path + ": " + std::string(what), err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(path + ": fstat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegularFileError(path, st.st_mode);
  }
  if ((flags & O_NONBLOCK) == 0) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(path + ": fcntl", err);
    }
  }
  return fd;
}

Result<std::string> ReadToEnd(int fd, const std::string& path, size_t max_bytes) {
  std::string text;
  char buf[64 << 10];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(path + ": read", errno);
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > max_bytes)
      return IOError(path + ": larger than " + std::to_string(max_bytes) + " bytes");
    text.append(buf, static_cast<size_t>(n));
  }
}

Result<std::string> ReadRegularFile(const std::string& path, size_t max_bytes) {
  PTC_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, O_RDONLY));
  Result<std::string> text = ReadToEnd(fd, path, max_bytes);
  ::close(fd);
  return text;
}

Status CheckRegularFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(path + ": stat", errno);
  if (!S_ISREG(st.st_mode)) return NotRegularFileError(path, st.st_mode);
  return Status::OK();
}

}  // namespace ptc
