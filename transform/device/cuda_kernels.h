// The strided copy kernel (cuda_kernels.cu): every descriptor of a list in
// one launch, writing straight into the destination buffers. Included by CUDA
// sources only.
#pragma once

#include <cuda_runtime.h>

#include "transform/device/strided_copy.h"

namespace ptc::transform::device {

// A descriptor list in device memory and its launch shape.
// Descriptor i gets blocks [first_block[i], first_block[i + 1]) of a 1-d grid,
// in proportion to its bytes (BlocksFor).
struct DeviceCopyList {
  const StridedCopy* copies = nullptr;  // device
  const uint32_t* first_block = nullptr;  // device, count + 1 entries
  int count = 0;
  uint32_t blocks = 0;  // first_block[count]
};

// Blocks for a descriptor of `bytes`: a warp per 4 KiB (256 16-byte units), at most 8192.
uint32_t BlocksFor(uint64_t bytes);

// Queues the copies of `list` on `stream`: from[i] / to[i] are device arrays
// of the rank's buffer addresses; staging the rank's staging buffer.
cudaError_t LaunchStridedCopies(const DeviceCopyList& list, const void* const* from, void* const* to,
                                unsigned char* staging, cudaStream_t stream);

}  // namespace ptc::transform::device
