// Reading and checking the peer token.
#include "cluster/token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "ptc/base/regular_file.h"

namespace ptc::cluster {

Status ValidateToken(std::string_view token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return InvalidArgumentError("token of " + std::to_string(token.size()) + " bytes: must be " +
                                std::to_string(kMinTokenBytes) + " to " + std::to_string(kMaxTokenBytes));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgumentError("token byte " + std::to_string(i) + " is not printable ASCII (no spaces)");
    }
  }
  return Status::OK();
}

Result<std::string> ReadTokenFile(const std::string& path) {
  // O_NONBLOCK: a FIFO given as the token file is refused below (not a regular
  // file), never waited on in open(2); reads of a regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(path + ": no such token file");
    return ErrnoError(path + ": cannot open the token file", err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(path + ": fstat", err);
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (!S_ISREG(st.st_mode) || (st.st_mode & 07177) != 0) {
    ::close(fd);
    return Status(Code::kPermissionDenied,
                  path + ": the token file must be a regular file of mode 0600 or tighter (it has " +
                      (S_ISREG(st.st_mode) ? std::string("mode ") + mode : std::string("another type")) +
                      "); chmod 600 " + path);
  }
  Result<std::string> read = ReadToEnd(fd, path, kMaxTokenBytes + 64);  // more: ValidateToken names the limit
  ::close(fd);
  PTC_ASSIGN_OR_RETURN(std::string text, std::move(read));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) {
    text.pop_back();
  }
  PTC_RETURN_IF_ERROR(ValidateToken(text), path);
  return text;
}

bool TokenEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace ptc::cluster
