// FUSE passthrough without a mount: the pure request/reply patching of the
// session's custom I/O (fs/fuse_io.h) on hand-made protocol buffers, and the
// backing-file registry (fs/passthrough.h) over a fake BackingDevice.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "fs/fuse_io.h"
#include "fs/passthrough.h"
#include "fs/passthrough_abi.h"

namespace ptcfs {
namespace {

namespace abi = fuse_abi;

// Records every call; fails Open with `next_error` when set.
class FakeDevice : public BackingDevice {
 public:
  struct Log {
    std::vector<int> opened;  // fds
    std::vector<int32_t> closed;
    ptc::Status next_error;
    int32_t next_id = 1;
  };
  explicit FakeDevice(Log* log) : log_(log) {}
  ptc::Result<int32_t> Open(int fd) override {
    if (!log_->next_error.ok()) return log_->next_error;
    log_->opened.push_back(fd);
    return log_->next_id++;
  }
  void Close(int32_t id) override { log_->closed.push_back(id); }

 private:
  Log* log_;
};

// An INIT request as the kernel sends it.
std::vector<char> InitRequest(uint64_t unique, uint32_t minor, uint32_t flags, uint32_t flags2) {
  abi::InHeader in = {};
  in.opcode = abi::kOpInit;
  in.unique = unique;
  abi::InitIn init = {};
  init.major = 7;
  init.minor = minor;
  init.flags = flags;
  init.flags2 = flags2;
  in.len = sizeof(in) + sizeof(init);
  std::vector<char> buf(in.len);
  std::memcpy(buf.data(), &in, sizeof(in));
  std::memcpy(buf.data() + sizeof(in), &init, sizeof(init));
  return buf;
}

// A Passthrough on, as after the kernel's INIT offered it (needs CAP_SYS_ADMIN).
bool TurnOn(Passthrough& pt, FakeDevice::Log* log) {
  const std::vector<char> req = InitRequest(42, 40, abi::kInitExt, abi::kPassthrough2);
  ObserveRequest(req.data(), req.size(), pt);
  pt.SetDevice(std::make_unique<FakeDevice>(log));
  return pt.enabled();
}

TEST(FuseIo, EncodeOpenFhPutsTheBackingIdAboveTheHandle) {
  EXPECT_EQ(EncodeOpenFh(7, 0), 7u);  // no backing: the handle alone
  const uint64_t fh = EncodeOpenFh(7, 5);
  EXPECT_EQ(fh & 0xffffffffull, 7u);
  EXPECT_EQ((fh >> 32) & 0x7fffffff, 5u);
  EXPECT_NE(fh >> 63, 0u);  // the mark PatchReply looks for
  EXPECT_EQ((EncodeOpenFh(0xfffffffe, 0x7fffffff) >> 32) & 0x7fffffff, 0x7fffffffu);
}

TEST(FuseIo, PatchReplyMakesAMarkedOpenReplyPassthrough) {
  Passthrough pt(true);
  abi::OutHeader out = {sizeof(abi::OutHeader) + sizeof(abi::OpenOut), 0, 9};
  abi::OpenOut open = {};
  open.fh = EncodeOpenFh(7, 5);
  open.open_flags = 1u << 1;  // FOPEN_KEEP_CACHE: the kernel refuses it with passthrough
  struct iovec iov[2] = {{&out, sizeof(out)}, {&open, sizeof(open)}};
  PatchReply(iov, 2, pt);
  EXPECT_EQ(open.fh, 7u);  // the kernel gets the handle alone
  EXPECT_EQ(open.backing_id, 5);
  EXPECT_EQ(open.open_flags, abi::kOpenPassthrough);

  // Unmarked, an error reply, or another shape: untouched.
  abi::OpenOut plain = {};
  plain.fh = 8;
  plain.open_flags = 1u << 1;
  iov[1] = {&plain, sizeof(plain)};
  PatchReply(iov, 2, pt);
  EXPECT_EQ(plain.fh, 8u);
  EXPECT_EQ(plain.backing_id, 0);
  EXPECT_EQ(plain.open_flags, 1u << 1);
  abi::OpenOut failed = {};
  failed.fh = EncodeOpenFh(7, 5);
  abi::OutHeader error = {sizeof(abi::OutHeader), -5, 9};
  struct iovec err_iov[2] = {{&error, sizeof(error)}, {&failed, sizeof(failed)}};
  PatchReply(err_iov, 2, pt);
  EXPECT_EQ(failed.fh, EncodeOpenFh(7, 5));
  PatchReply(iov, 1, pt);  // a header alone
}

// A CREATE reply (a save's new file): fuse_entry_out, then the open reply;
// the entry is left as it is.
TEST(FuseIo, PatchReplyMakesAMarkedCreateReplyPassthrough) {
  Passthrough pt(true);
  std::vector<char> body(abi::kEntryOutSize + sizeof(abi::OpenOut), '\x5a');
  abi::OpenOut open = {};
  open.fh = EncodeOpenFh(11, 3);
  open.open_flags = 1u << 0;  // FOPEN_DIRECT_IO: kept (the kernel's passthrough overrides it)
  std::memcpy(body.data() + abi::kEntryOutSize, &open, sizeof(open));
  abi::OutHeader out = {static_cast<uint32_t>(sizeof(abi::OutHeader) + body.size()), 0, 4};
  struct iovec iov[2] = {{&out, sizeof(out)}, {body.data(), body.size()}};
  PatchReply(iov, 2, pt);
  abi::OpenOut patched;
  std::memcpy(&patched, body.data() + abi::kEntryOutSize, sizeof(patched));
  EXPECT_EQ(patched.fh, 11u);
  EXPECT_EQ(patched.backing_id, 3);
  EXPECT_EQ(patched.open_flags, abi::kOpenPassthrough | (1u << 0));
  EXPECT_EQ(std::string(body.data(), abi::kEntryOutSize), std::string(abi::kEntryOutSize, '\x5a'));
  // Unmarked: untouched.
  open.fh = 12;
  std::memcpy(body.data() + abi::kEntryOutSize, &open, sizeof(open));
  PatchReply(iov, 2, pt);
  std::memcpy(&patched, body.data() + abi::kEntryOutSize, sizeof(patched));
  EXPECT_EQ(patched.fh, 12u);
  EXPECT_EQ(patched.backing_id, 0);
  EXPECT_EQ(patched.open_flags, 1u << 0);
}

TEST(FuseIo, ObserveRequestTellsWhetherTheKernelOffersPassthrough) {
  {
    Passthrough pt(true);
    const std::vector<char> old = InitRequest(3, 39, abi::kInitExt, abi::kPassthrough2);  // protocol before 7.40
    ObserveRequest(old.data(), old.size(), pt);
    EXPECT_EQ(pt.init_unique(), 3u);
    EXPECT_FALSE(pt.init_enabled());
    EXPECT_EQ(pt.State(), "off: the kernel offers no FUSE passthrough (Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH)");
  }
  {
    Passthrough pt(true);
    const std::vector<char> no_flag = InitRequest(4, 41, abi::kInitExt, 0);
    ObserveRequest(no_flag.data(), no_flag.size(), pt);
    EXPECT_FALSE(pt.init_enabled());
    // Too short to be an INIT, or another opcode: not looked at.
    Passthrough other(true);
    ObserveRequest(no_flag.data(), sizeof(abi::InHeader) + 4, other);
    std::vector<char> lookup = InitRequest(5, 40, abi::kInitExt, abi::kPassthrough2);
    lookup[4] = 1;  // opcode FUSE_LOOKUP
    ObserveRequest(lookup.data(), lookup.size(), other);
    EXPECT_EQ(other.init_unique(), 0u);
    EXPECT_EQ(other.State(), "off: not initialised yet");
  }
  {
    Passthrough off(false);
    const std::vector<char> req = InitRequest(6, 40, abi::kInitExt, abi::kPassthrough2);
    ObserveRequest(req.data(), req.size(), off);
    EXPECT_FALSE(off.init_enabled());
    EXPECT_EQ(off.State(), "off: --passthrough off");
  }
  Passthrough pt(true);
  const std::vector<char> req = InitRequest(42, 40, abi::kInitExt, abi::kPassthrough2);
  ObserveRequest(req.data(), req.size(), pt);
  EXPECT_EQ(pt.init_unique(), 42u);
  if (!MayRegisterBackingFiles()) {
    EXPECT_EQ(pt.State(), "off: registering backing files needs CAP_SYS_ADMIN (the daemon is not root)");
    return;
  }
  EXPECT_TRUE(pt.init_enabled());
  EXPECT_FALSE(pt.enabled());  // no device yet
  EXPECT_EQ(pt.State(), "off: no device");
  FakeDevice::Log log;
  pt.SetDevice(std::make_unique<FakeDevice>(&log));
  EXPECT_TRUE(pt.enabled());
  EXPECT_EQ(pt.State(), "on");
}

TEST(FuseIo, PatchReplyTurnsPassthroughOnInTheInitReplyOnly) {
  Passthrough pt(true);
  FakeDevice::Log log;
  if (!TurnOn(pt, &log)) GTEST_SKIP() << "needs CAP_SYS_ADMIN: " << pt.State();
  abi::OutHeader out = {sizeof(abi::OutHeader) + sizeof(abi::InitOut), 0, 42};
  abi::InitOut init = {};
  init.major = 7;
  init.flags = abi::kWritebackCache | 1u;
  struct iovec iov[2] = {{&out, sizeof(out)}, {&init, sizeof(init)}};
  PatchReply(iov, 2, pt);
  EXPECT_EQ(init.flags, abi::kInitExt | 1u);  // writeback caching excludes passthrough
  EXPECT_EQ(init.flags2, abi::kPassthrough2);
  EXPECT_EQ(init.max_stack_depth, abi::kMaxStackDepth);
  // A reply of the same size to another request is not the INIT reply.
  abi::InitOut other = {};
  abi::OutHeader other_out = {sizeof(abi::OutHeader) + sizeof(abi::InitOut), 0, 43};
  struct iovec other_iov[2] = {{&other_out, sizeof(other_out)}, {&other, sizeof(other)}};
  PatchReply(other_iov, 2, pt);
  EXPECT_EQ(other.flags2, 0u);
  // A mount that does not want it leaves INIT as libfuse wrote it.
  Passthrough off(false);
  const std::vector<char> req = InitRequest(42, 40, abi::kInitExt, abi::kPassthrough2);
  ObserveRequest(req.data(), req.size(), off);
  abi::InitOut untouched = {};
  iov[1] = {&untouched, sizeof(untouched)};
  PatchReply(iov, 2, off);
  EXPECT_EQ(untouched.flags2, 0u);
  EXPECT_EQ(untouched.max_stack_depth, 0u);
}

TEST(PassthroughRegistry, OneBackingIdPerInodeClosedAfterItsLastRelease) {
  Passthrough pt(true);
  FakeDevice::Log log;
  EXPECT_EQ(pt.Acquire(10, 3).status().code(), ptc::Code::kFailedPrecondition);  // not on yet
  if (!TurnOn(pt, &log)) GTEST_SKIP() << "needs CAP_SYS_ADMIN: " << pt.State();
  auto a = pt.Acquire(10, 3);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = pt.Acquire(10, 4);  // a second open of the inode: the same id, nothing registered
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(log.opened, std::vector<int>{3});
  auto c = pt.Acquire(11, 5);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a);
  EXPECT_EQ(pt.backed(), 2u);
  pt.Release(10);
  EXPECT_TRUE(log.closed.empty());  // one open of inode 10 left
  pt.Release(10);
  EXPECT_EQ(log.closed, std::vector<int32_t>{*a});
  EXPECT_EQ(pt.backed(), 1u);
  pt.Release(10);  // not held: nothing
  pt.Release(99);
  EXPECT_EQ(log.closed.size(), 1u);
  pt.Release(11);
  EXPECT_EQ(log.closed, (std::vector<int32_t>{*a, *c}));
  EXPECT_EQ(pt.backed(), 0u);
  // Registered again after its last release: a new id.
  auto d = pt.Acquire(10, 6);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(log.opened.size(), 3u);
}

TEST(PassthroughRegistry, ErrorsOfTheDevice) {
  Passthrough pt(true);
  FakeDevice::Log log;
  if (!TurnOn(pt, &log)) GTEST_SKIP() << "needs CAP_SYS_ADMIN: " << pt.State();
  // Another failure: this open goes through the daemon; passthrough stays on.
  log.next_error = ptc::IOError("FUSE_DEV_IOC_BACKING_OPEN: too many open files");
  EXPECT_EQ(pt.Acquire(10, 3).status().code(), ptc::Code::kIOError);
  EXPECT_EQ(pt.backed(), 0u);
  EXPECT_EQ(pt.State(), "on");
  // Not permitted: off for the mount, saying why.
  log.next_error = ptc::Status(ptc::Code::kPermissionDenied, "FUSE_DEV_IOC_BACKING_OPEN: operation not permitted");
  EXPECT_EQ(pt.Acquire(10, 3).status().code(), ptc::Code::kPermissionDenied);
  EXPECT_FALSE(pt.enabled());
  EXPECT_EQ(pt.State(), "off: FUSE_DEV_IOC_BACKING_OPEN: operation not permitted");
  log.next_error = ptc::Status::OK();
  EXPECT_EQ(pt.Acquire(11, 4).status().code(), ptc::Code::kFailedPrecondition);
  EXPECT_TRUE(log.opened.empty());
}

}  // namespace
}  // namespace ptcfs
