// A strided copy: the one descriptor every switch executor runs, on the CPU
// (ApplyCopy below) and in the CUDA pack/unpack kernels (cuda_kernels.cu).
// It is plain old data so that an array of them can be copied to the device
// as it is.
//
// Element x (a multi-index below `extent`) moves from
//   src buffer + (src_offset + sum_d x[d] * src_stride[d]) * elem_size
// to
//   dst buffer + (dst_offset + sum_d x[d] * dst_stride[d]) * elem_size.
// Offsets and strides count elements of elem_size bytes. Dimensions are
// collapsed where both sides are contiguous across them (MakeCopy), so a copy
// between two dense boxes is one run.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace ptc::transform::device {

#ifdef __CUDACC__
#define PTC_HOST_DEVICE __host__ __device__
#else
#define PTC_HOST_DEVICE
#endif

inline constexpr int kMaxCopyDims = 4;
// Buffer index of the staging buffer (the bucket's send/receive area).
inline constexpr int32_t kStagingBuffer = -1;

struct StridedCopy {
  int32_t src = 0;         // index into the rank's layout-A buffers, or kStagingBuffer
  int32_t dst = 0;         // index into the rank's layout-B buffers, or kStagingBuffer
  uint32_t elem_size = 1;  // bytes: 1, 2, 4 or 8
  uint32_t ndim = 0;       // 0: one element
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  int64_t extent[kMaxCopyDims] = {};
  int64_t src_stride[kMaxCopyDims] = {};
  int64_t dst_stride[kMaxCopyDims] = {};

  PTC_HOST_DEVICE int64_t elements() const {
    int64_t n = 1;
    for (uint32_t d = 0; d < ndim; ++d) n *= extent[d];
    return n;
  }
  PTC_HOST_DEVICE uint64_t bytes() const { return static_cast<uint64_t>(elements()) * elem_size; }
};

// Builds a descriptor from per-dimension extents and strides (outermost
// first), dropping dimensions of extent 1 and merging neighbours that are
// contiguous on both sides. Returns false when more than kMaxCopyDims
// dimensions remain.
bool MakeCopy(int32_t src, int64_t src_offset, const std::vector<int64_t>& src_strides, int32_t dst,
              int64_t dst_offset, const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& extents,
              uint32_t elem_size, StridedCopy* out);

// Runs one descriptor between host buffers (the addresses of its src and dst
// buffers, already resolved).
void ApplyCopy(const StridedCopy& c, const void* src, void* dst);

}  // namespace ptc::transform::device
