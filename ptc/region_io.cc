#include "ptc/region_io.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ptc {
namespace {

// [first, last) element addresses of `region` in `layout` over `box`.
std::pair<Index, Index> Span(const Box& region, const Box& box, const Layout& layout) {
  Index lo = layout.offset, hi = layout.offset;
  for (size_t d = 0; d < region.rank(); ++d) {
    lo += (region.begin[d] - box.begin[d]) * layout.strides[d];
    hi += (region.end[d] - 1 - box.begin[d]) * layout.strides[d];
  }
  return {lo, hi + 1};
}

}  // namespace

Status ReadRegion(const FileTensor& src, const Box& region, void* dst, const Box& dst_box,
                  const Layout& dst_layout, uint64_t max_span) {
  if (region.empty() && region.rank() > 0) return Status::OK();
  auto [lo, hi] = Span(region, src.box, src.layout);
  const uint64_t span = static_cast<uint64_t>(hi - lo) * src.elem_size;
  if (span > max_span) {
    // Split the outermost dimension that has more than one element.
    for (size_t d = 0; d < region.rank(); ++d) {
      const Index n = region.end[d] - region.begin[d];
      if (n < 2) continue;
      Box a = region, b = region;
      a.end[d] = b.begin[d] = region.begin[d] + n / 2;
      PTC_RETURN_IF_ERROR(ReadRegion(src, a, dst, dst_box, dst_layout, max_span));
      return ReadRegion(src, b, dst, dst_box, dst_layout, max_span);
    }
  }
  std::vector<unsigned char> buf(span);
  PTC_RETURN_IF_ERROR(src.file->Read(src.base + static_cast<uint64_t>(lo) * src.elem_size, span, buf.data()));
  // Addresses relative to lo: a layout whose offset is shifted by -lo.
  Layout shifted = src.layout;
  shifted.offset -= lo;
  CopyRegion(region, buf.data(), src.box, shifted, dst, dst_box, dst_layout, src.elem_size);
  return Status::OK();
}

}  // namespace ptc
