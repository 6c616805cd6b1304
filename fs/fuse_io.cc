#define FUSE_USE_VERSION 312
#include "fs/fuse_io.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <unistd.h>

#include <cstring>

#include "fs/filesystem.h"
#include "fs/passthrough_abi.h"

namespace ptcfs {
namespace {

constexpr uint64_t kBackingMark = 1ull << 63;

Passthrough& PassthroughOf(void* userdata) { return static_cast<Filesystem*>(userdata)->passthrough(); }

ssize_t IoRead(int fd, void* buf, size_t len, void* userdata) {
  const ssize_t n = ::read(fd, buf, len);
  if (n > 0) ObserveRequest(buf, static_cast<size_t>(n), PassthroughOf(userdata));
  return n;
}

ssize_t IoWritev(int fd, struct iovec* iov, int count, void* userdata) {
  PatchReply(iov, count, PassthroughOf(userdata));
  return ::writev(fd, iov, count);
}

// libfuse 3.14 splices only through these when the I/O is custom.
ssize_t IoSplice(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned int flags, void*) {
  return ::splice(fdin, offin, fdout, offout, len, flags);
}

}  // namespace

uint64_t EncodeOpenFh(uint64_t handle, int32_t backing_id) {
  if (backing_id <= 0) return handle;
  return handle | kBackingMark | (static_cast<uint64_t>(backing_id) << 32);
}

void ObserveRequest(const void* buf, size_t n, Passthrough& pt) {
  if (n < sizeof(fuse_abi::InHeader) + offsetof(fuse_abi::InitIn, flags2) + sizeof(uint32_t)) return;
  fuse_abi::InHeader in;
  std::memcpy(&in, buf, sizeof(in));
  if (in.opcode != fuse_abi::kOpInit) return;
  fuse_abi::InitIn init = {};
  std::memcpy(&init, static_cast<const char*>(buf) + sizeof(in), std::min(sizeof(init), n - sizeof(in)));
  const bool offered = init.major == 7 && init.minor >= 40 && (init.flags & fuse_abi::kInitExt) &&
                       (init.flags2 & fuse_abi::kPassthrough2);
  pt.OnInit(in.unique, offered);
}

void PatchReply(struct iovec* iov, int count, const Passthrough& pt) {
  if (count != 2 || iov[0].iov_len != sizeof(fuse_abi::OutHeader)) return;
  const auto* out = static_cast<const fuse_abi::OutHeader*>(iov[0].iov_base);
  if (out->error != 0) return;
  const bool create = iov[1].iov_len == fuse_abi::kEntryOutSize + sizeof(fuse_abi::OpenOut);
  if (iov[1].iov_len == sizeof(fuse_abi::OpenOut) || create) {
    // Only OPEN and CREATE replies carry the mark (OPENDIR's fh is libfuse's 0;
    // ptcfs has no ioctl, the other 16-byte reply; none other has 144 bytes).
    char* at = static_cast<char*>(iov[1].iov_base) + (create ? fuse_abi::kEntryOutSize : 0);
    fuse_abi::OpenOut open;
    std::memcpy(&open, at, sizeof(open));  // libfuse's CREATE buffer is a char array
    if (!(open.fh & kBackingMark)) return;
    open.backing_id = static_cast<int32_t>((open.fh >> 32) & 0x7fffffff);
    open.fh &= 0xffffffffull;
    open.open_flags = (open.open_flags | fuse_abi::kOpenPassthrough) & fuse_abi::kOpenPassthroughMask;
    std::memcpy(at, &open, sizeof(open));
    return;
  }
  if (iov[1].iov_len == sizeof(fuse_abi::InitOut) && out->unique == pt.init_unique() && pt.init_enabled()) {
    auto* init = static_cast<fuse_abi::InitOut*>(iov[1].iov_base);
    init->flags |= fuse_abi::kInitExt;
    init->flags &= ~fuse_abi::kWritebackCache;
    init->flags2 |= fuse_abi::kPassthrough2;
    init->max_stack_depth = fuse_abi::kMaxStackDepth;
  }
}

ptc::Status InstallPassthroughIo(struct fuse_session* se, Passthrough& pt) {
  static const struct fuse_custom_io io = {IoWritev, IoRead, IoSplice, IoSplice};
  const int fd = fuse_session_fd(se);
  if (fuse_session_custom_io(se, &io, fd) != 0) return ptc::IOError("fuse_session_custom_io failed");
  pt.SetDevice(FuseBackingDevice(fd));
  return ptc::Status::OK();
}

}  // namespace ptcfs
