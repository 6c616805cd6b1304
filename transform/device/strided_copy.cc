#include "transform/device/strided_copy.h"

#include <cstring>

namespace ptc::transform::device {

bool MakeCopy(int32_t src, int64_t src_offset, const std::vector<int64_t>& src_strides, int32_t dst,
              int64_t dst_offset, const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& extents,
              uint32_t elem_size, StridedCopy* out) {
  // Dimensions of extent > 1, outermost first, merged from the inside out.
  std::vector<int64_t> ext, ss, ds;
  for (size_t d = 0; d < extents.size(); ++d) {
    if (extents[d] == 1) continue;
    ext.push_back(extents[d]);
    ss.push_back(src_strides[d]);
    ds.push_back(dst_strides[d]);
  }
  for (size_t d = ext.size(); d-- > 1;) {
    // Merge d-1 into d when stepping d-1 once equals stepping d extent[d] times, on both sides.
    if (ss[d - 1] == ss[d] * ext[d] && ds[d - 1] == ds[d] * ext[d]) {
      ext[d - 1] *= ext[d];
      ss[d - 1] = ss[d];
      ds[d - 1] = ds[d];
      ext.erase(ext.begin() + d);
      ss.erase(ss.begin() + d);
      ds.erase(ds.begin() + d);
    }
  }
  if (ext.size() > static_cast<size_t>(kMaxCopyDims)) return false;
  StridedCopy c;
  c.src = src;
  c.dst = dst;
  c.elem_size = elem_size;
  c.ndim = static_cast<uint32_t>(ext.size());
  c.src_offset = src_offset;
  c.dst_offset = dst_offset;
  for (size_t d = 0; d < ext.size(); ++d) {
    c.extent[d] = ext[d];
    c.src_stride[d] = ss[d];
    c.dst_stride[d] = ds[d];
  }
  *out = c;
  return true;
}

namespace {

// Copies the innermost dimension (or one element when ndim == 0).
void CopyRun(const StridedCopy& c, const unsigned char* s, unsigned char* d) {
  const size_t e = c.elem_size;
  if (c.ndim == 0) {
    std::memcpy(d, s, e);
    return;
  }
  const int inner = static_cast<int>(c.ndim) - 1;
  const int64_t n = c.extent[inner];
  if (c.src_stride[inner] == 1 && c.dst_stride[inner] == 1) {
    std::memcpy(d, s, n * e);
    return;
  }
  const int64_t sst = c.src_stride[inner] * e, dst = c.dst_stride[inner] * e;
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * dst, s + i * sst, e);
}

}  // namespace

void ApplyCopy(const StridedCopy& c, const void* src, void* dst) {
  const auto* s = static_cast<const unsigned char*>(src) + c.src_offset * c.elem_size;
  auto* d = static_cast<unsigned char*>(dst) + c.dst_offset * c.elem_size;
  if (c.ndim <= 1) {
    CopyRun(c, s, d);
    return;
  }
  // Odometer over the outer dimensions.
  const int outer = static_cast<int>(c.ndim) - 1;
  int64_t idx[kMaxCopyDims] = {};
  while (true) {
    int64_t so = 0, dof = 0;
    for (int k = 0; k < outer; ++k) so += idx[k] * c.src_stride[k], dof += idx[k] * c.dst_stride[k];
    CopyRun(c, s + so * c.elem_size, d + dof * c.elem_size);
    int k = outer - 1;
    while (k >= 0 && ++idx[k] == c.extent[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}

}  // namespace ptc::transform::device
