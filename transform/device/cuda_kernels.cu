#include "transform/device/cuda_kernels.h"

#include <algorithm>

namespace ptc::transform::device {
namespace {

constexpr int kThreads = 256;

// Units of T per work item: one warp copies a chunk of up to kChunk units of
// one row, its lanes on consecutive units (coalesced). Rows and chunks are
// found with one division per chunk, not per unit.
constexpr uint64_t kChunk = 256;

// Copies rows x upr units of T: row r (row-major over the outer dimensions)
// starts at the descriptor's strides; units inside a row are contiguous.
template <typename T>
__device__ void CopyUnits(const StridedCopy& c, const unsigned char* s, unsigned char* d, uint64_t upr,
                          uint64_t rows, uint32_t block, uint32_t blocks) {
  const int outer = static_cast<int>(c.ndim) - 1;
  const uint64_t chunks = (upr + kChunk - 1) / kChunk;
  const uint64_t items = rows * chunks;
  const uint32_t lane = threadIdx.x % 32;
  const uint64_t warps = static_cast<uint64_t>(blocks) * (blockDim.x / 32);
  for (uint64_t w = static_cast<uint64_t>(block) * (blockDim.x / 32) + threadIdx.x / 32; w < items; w += warps) {
    uint64_t row = w / chunks;
    const uint64_t first = (w - row * chunks) * kChunk;
    const uint64_t last = first + kChunk < upr ? first + kChunk : upr;
    int64_t so = 0, dof = 0;
    for (int k = outer - 1; k >= 0; --k) {
      const uint64_t i = row % static_cast<uint64_t>(c.extent[k]);
      row /= static_cast<uint64_t>(c.extent[k]);
      so += static_cast<int64_t>(i) * c.src_stride[k];
      dof += static_cast<int64_t>(i) * c.dst_stride[k];
    }
    const T* src = reinterpret_cast<const T*>(s + so * c.elem_size);
    T* dst = reinterpret_cast<T*>(d + dof * c.elem_size);
#pragma unroll 8
    for (uint64_t u = first + lane; u < last; u += 32) dst[u] = src[u];
  }
}

// Element by element over every dimension: a descriptor whose innermost
// dimension is strided (no schema makes one today).
__device__ void CopyElements(const StridedCopy& c, const unsigned char* s, unsigned char* d, uint32_t block,
                             uint32_t blocks) {
  const uint64_t total = static_cast<uint64_t>(c.elements());
  const uint64_t step = static_cast<uint64_t>(blocks) * blockDim.x;
  for (uint64_t t = static_cast<uint64_t>(block) * blockDim.x + threadIdx.x; t < total; t += step) {
    uint64_t rest = t;
    int64_t so = 0, dof = 0;
    for (int k = static_cast<int>(c.ndim) - 1; k >= 0; --k) {
      const uint64_t i = rest % static_cast<uint64_t>(c.extent[k]);
      rest /= static_cast<uint64_t>(c.extent[k]);
      so += static_cast<int64_t>(i) * c.src_stride[k];
      dof += static_cast<int64_t>(i) * c.dst_stride[k];
    }
    for (uint32_t b = 0; b < c.elem_size; ++b) d[dof * c.elem_size + b] = s[so * c.elem_size + b];
  }
}

__global__ void StridedCopyKernel(const StridedCopy* copies, const uint32_t* first_block, int count,
                                  const void* const* from, void* const* to, unsigned char* staging) {
  // This block's descriptor: the last i with first_block[i] <= blockIdx.x.
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= blockIdx.x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int i = lo;
  const uint32_t block = blockIdx.x - first_block[i], blocks = first_block[i + 1] - first_block[i];
  {
    const StridedCopy& c = copies[i];
    const unsigned char* s =
        (c.src == kStagingBuffer ? staging : static_cast<const unsigned char*>(from[c.src])) + c.src_offset * c.elem_size;
    unsigned char* d =
        (c.dst == kStagingBuffer ? staging : static_cast<unsigned char*>(to[c.dst])) + c.dst_offset * c.elem_size;
    const int inner = static_cast<int>(c.ndim) - 1;
    if (inner >= 0 && (c.src_stride[inner] != 1 || c.dst_stride[inner] != 1)) {
      CopyElements(c, s, d, block, blocks);
      return;
    }
    // Rows of the innermost dimension are contiguous on both sides: copy them
    // in the widest unit that every row start and length allows.
    const uint64_t row_bytes = (inner >= 0 ? static_cast<uint64_t>(c.extent[inner]) : 1) * c.elem_size;
    uint64_t align = reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | row_bytes;
    uint64_t rows = 1;
    for (int k = 0; k < inner; ++k) {
      align |= static_cast<uint64_t>(c.src_stride[k] * c.elem_size) | static_cast<uint64_t>(c.dst_stride[k] * c.elem_size);
      rows *= static_cast<uint64_t>(c.extent[k]);
    }
    if (align % 16 == 0) {
      CopyUnits<uint4>(c, s, d, row_bytes / 16, rows, block, blocks);
    } else if (align % 8 == 0) {
      CopyUnits<uint2>(c, s, d, row_bytes / 8, rows, block, blocks);
    } else if (align % 4 == 0) {
      CopyUnits<unsigned int>(c, s, d, row_bytes / 4, rows, block, blocks);
    } else if (align % 2 == 0) {
      CopyUnits<unsigned short>(c, s, d, row_bytes / 2, rows, block, blocks);
    } else {
      CopyUnits<unsigned char>(c, s, d, row_bytes, rows, block, blocks);
    }
  }
}

}  // namespace

uint32_t BlocksFor(uint64_t bytes) {
  // One warp per chunk of 16-byte units, kThreads / 32 warps a block.
  const uint64_t per_block = kChunk * 16 * (kThreads / 32);
  return static_cast<uint32_t>(std::clamp<uint64_t>((bytes + per_block - 1) / per_block, 1, 8192));
}

cudaError_t LaunchStridedCopies(const DeviceCopyList& list, const void* const* from, void* const* to,
                                unsigned char* staging, cudaStream_t stream) {
  if (list.count == 0) return cudaSuccess;
  StridedCopyKernel<<<list.blocks, kThreads, 0, stream>>>(list.copies, list.first_block, list.count, from, to,
                                                          staging);
  return cudaGetLastError();
}

}  // namespace ptc::transform::device
