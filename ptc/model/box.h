// Box math: n-d hyperslabs of a global tensor and how their elements are laid
// out in linear buffers.
//
// A Box is [begin, end) per dimension in global coordinates. A Layout says
// where each element of a box lives in some linear buffer (a shard file, a
// rank's local tensor, a ZeRO flat buffer):
//
//   address(x) = offset + sum_d (x[d] - box.begin[d]) * strides[d]     (elements)
//
// Dense row-major storage of a box is DenseLayout(box). A rank's local tensor
// that holds a box at some origin uses the local tensor's row-major strides.
// ForEachRun walks a region of two layouts at once and yields the longest
// runs that are contiguous in both, which is all that copying needs.
//
// Everything here is pure and thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ptc {

using Index = int64_t;
using Shape = std::vector<Index>;

Index NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[4, 64]"
// Row-major strides (elements) of a dense tensor of `shape`.
std::vector<Index> RowMajorStrides(const Shape& shape);

struct Box {
  std::vector<Index> begin;
  std::vector<Index> end;

  static Box Full(const Shape& shape);

  size_t rank() const { return begin.size(); }
  Shape shape() const;
  Index volume() const;
  bool empty() const { return volume() == 0; }
  std::string ToString() const;  // "[0:4, 8:16]"

  friend bool operator==(const Box&, const Box&) = default;
  friend auto operator<=>(const Box&, const Box&) = default;
};

// The common part of two boxes of the same rank, or nullopt when it is empty.
std::optional<Box> Intersect(const Box& a, const Box& b);
// True when `inner` lies within `outer` (an empty inner box is contained anywhere).
bool Contains(const Box& outer, const Box& inner);
// a minus b as at most 2*rank disjoint boxes (a itself when they do not meet).
std::vector<Box> Subtract(const Box& a, const Box& b);
// `box` moved by `delta` per dimension.
Box Translate(const Box& box, const std::vector<Index>& delta);

struct Layout {
  Index offset = 0;            // address of box.begin, in elements
  std::vector<Index> strides;  // elements per step in each dimension
  friend bool operator==(const Layout&, const Layout&) = default;
};

// Dense row-major layout of `box` starting at element `offset`.
Layout DenseLayout(const Box& box, Index offset = 0);

// Calls fn(src_address, dst_address, count) for each maximal run of `region`
// that is contiguous in both layouts, in row-major order of `region`.
// REQUIRES: region is contained in src_box and dst_box; all of the same rank.
void ForEachRun(const Box& region, const Box& src_box, const Layout& src, const Box& dst_box, const Layout& dst,
                const std::function<void(Index, Index, Index)>& fn);

// Row-major byte ranges (offset, length) that `sub` occupies inside a densely
// stored `shard` box with elements of `elem_size` bytes, merged where adjacent.
// REQUIRES: Contains(shard, sub).
std::vector<std::pair<uint64_t, uint64_t>> ByteRanges(const Box& shard, const Box& sub, size_t elem_size);

// Copies the elements of `region` from one buffer to another.
// REQUIRES: as ForEachRun; both buffers large enough for their layouts.
void CopyRegion(const Box& region, const void* src, const Box& src_box, const Layout& src_layout, void* dst,
                const Box& dst_box, const Layout& dst_layout, size_t elem_size);

// Splits the row-major flat range [first, last) of a dense tensor of `shape`
// into at most 2*rank-1 boxes, each contiguous in row-major order, in order.
std::vector<Box> FlatRangeToBoxes(const Shape& shape, Index first, Index last);

}  // namespace ptc
