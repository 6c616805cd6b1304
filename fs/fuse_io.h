// The session's I/O with /dev/fuse when passthrough is wanted: libfuse 3.14
// predates FUSE passthrough, so its INIT, OPEN and CREATE replies are patched
// on their way to the kernel (fuse_session_custom_io): INIT gets
// FUSE_PASSTHROUGH and max_stack_depth; an OPEN or CREATE reply whose fh
// carries a backing id (EncodeOpenFh) gets FOPEN_PASSTHROUGH and that id. Splicing stays as libfuse does it.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "fs/passthrough.h"

struct fuse_session;

namespace ptcfs {

// The fh an OPEN reply carries to the custom I/O: the handle, with a backing
// id above it when the file is to be read through the kernel. The kernel gets
// (and later sends back) the handle alone.
// REQUIRES: handle < 2^32, backing_id >= 0 (0: none).
uint64_t EncodeOpenFh(uint64_t handle, int32_t backing_id);

// Pure, for the custom I/O and tests. A request read from the device: when it
// is INIT, tells `pt` (Passthrough::OnInit).
void ObserveRequest(const void* buf, size_t n, Passthrough& pt);
// A reply about to be written: patches the INIT reply (when `pt` turned
// passthrough on) and OPEN and CREATE replies that carry a backing id.
void PatchReply(struct iovec* iov, int count, const Passthrough& pt);

// Installs the custom I/O on a mounted session (its userdata must be a
// Filesystem, whose passthrough() it uses) and the backing device.
// \error IOError when libfuse refuses.
ptc::Status InstallPassthroughIo(struct fuse_session* se, Passthrough& pt);

}  // namespace ptcfs
