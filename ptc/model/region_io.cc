#include "ptc/model/region_io.h"

#include <algorithm>
#include <cstring>
#include <memory>

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

// True when `region` occupies exactly [lo, lo + volume) in both layouts with
// its elements in the same order: the file's bytes can be read straight into
// the destination.
bool SameContiguousRun(const Box& region, Index src_span, const Layout& src, Index dst_span, const Layout& dst) {
  const Index n = region.volume();
  if (src_span != n || dst_span != n) return false;
  for (size_t d = 0; d < region.rank(); ++d) {
    if (region.end[d] - region.begin[d] > 1 && src.strides[d] != dst.strides[d]) return false;
  }
  return true;
}

// Scratch space for one thread's reads: not zero-filled, reused from call to
// call; spans above kKeepBytes are allocated per call so that a thread does
// not hold on to a large buffer.
constexpr uint64_t kKeepBytes = 4ull << 20;

char* Scratch(uint64_t n, std::unique_ptr<char[]>* once) {
  thread_local std::unique_ptr<char[]> buf;
  thread_local uint64_t size = 0;
  if (n > kKeepBytes) {
    *once = std::make_unique_for_overwrite<char[]>(n);
    return once->get();
  }
  if (n > size) {
    size = std::max<uint64_t>(n, std::min<uint64_t>(2 * size, kKeepBytes));
    buf = std::make_unique_for_overwrite<char[]>(size);
  }
  return buf.get();
}

}  // namespace

Status ReadRegion(const FileTensor& src, const Box& region, void* dst, const Box& dst_box, const Layout& dst_layout,
                  uint64_t max_span) {
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
  const uint64_t file_offset = src.base + static_cast<uint64_t>(lo) * src.elem_size;
  auto [dst_lo, dst_hi] = Span(region, dst_box, dst_layout);
  if (SameContiguousRun(region, hi - lo, src.layout, dst_hi - dst_lo, dst_layout)) {
    return src.file->Read(file_offset, span, static_cast<char*>(dst) + dst_lo * src.elem_size);
  }
  std::unique_ptr<char[]> once;
  char* buf = Scratch(span, &once);
  PTC_RETURN_IF_ERROR(src.file->Read(file_offset, span, buf));
  // Addresses relative to lo: a layout whose offset is shifted by -lo.
  Layout shifted = src.layout;
  shifted.offset -= lo;
  CopyRegion(region, buf, src.box, shifted, dst, dst_box, dst_layout, src.elem_size);
  return Status::OK();
}

}  // namespace ptc
