// The kernel's FUSE passthrough ABI (protocol 7.40, Linux 6.9), which the
// system's <linux/fuse.h> (7.38) and libfuse 3.14 predate. Values from the
// kernel's include/uapi/linux/fuse.h.
#pragma once

#include <sys/ioctl.h>

#include <cstdint>

namespace ptcfs::fuse_abi {

constexpr uint32_t kInitExt = 1u << 30;         // FUSE_INIT_EXT: flags2 is valid
constexpr uint32_t kPassthrough2 = 1u << 5;     // FUSE_PASSTHROUGH, in flags2 (bit 37 of the 64-bit flags)
constexpr uint32_t kWritebackCache = 1u << 16;  // FUSE_WRITEBACK_CACHE: excludes passthrough
constexpr uint32_t kOpenPassthrough = 1u << 7;  // FOPEN_PASSTHROUGH
// FOPEN_PASSTHROUGH_MASK: the only open flags a passthrough open may carry
// (FOPEN_KEEP_CACHE makes the kernel fail the open with EIO).
constexpr uint32_t kOpenPassthroughMask = kOpenPassthrough | (1u << 0) | (1u << 5) | (1u << 6);
constexpr uint32_t kOpInit = 26;        // FUSE_INIT
constexpr uint32_t kMaxStackDepth = 2;  // FILESYSTEM_MAX_STACK_DEPTH: a store on overlayfs too

struct InHeader {  // fuse_in_header
  uint32_t len, opcode;
  uint64_t unique, nodeid;
  uint32_t uid, gid, pid;
  uint16_t total_extlen, padding;
};
struct InitIn {  // fuse_init_in (7.36+)
  uint32_t major, minor, max_readahead, flags, flags2, unused[11];
};
struct OutHeader {  // fuse_out_header
  uint32_t len;
  int32_t error;
  uint64_t unique;
};
struct InitOut {  // fuse_init_out (7.40)
  uint32_t major, minor, max_readahead, flags;
  uint16_t max_background, congestion_threshold;
  uint32_t max_write, time_gran;
  uint16_t max_pages, map_alignment;
  uint32_t flags2, max_stack_depth;
  uint16_t request_timeout, unused[11];
};
struct OpenOut {  // fuse_open_out (7.40: padding became backing_id)
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
struct BackingMap {  // fuse_backing_map
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
// A CREATE reply: fuse_entry_out (7.9+), then fuse_open_out.
constexpr size_t kEntryOutSize = 128;
static_assert(sizeof(InHeader) == 40 && sizeof(InitOut) == 64 && sizeof(OpenOut) == 16);

constexpr unsigned long kIocBackingOpen = _IOW(229, 1, BackingMap);  // FUSE_DEV_IOC_BACKING_OPEN
constexpr unsigned long kIocBackingClose = _IOW(229, 2, uint32_t);   // FUSE_DEV_IOC_BACKING_CLOSE

}  // namespace ptcfs::fuse_abi
