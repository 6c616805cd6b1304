#include "ptc/model/box.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace ptc {

Index NumElements(const Shape& shape) {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<Index> RowMajorStrides(const Shape& shape) {
  std::vector<Index> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

Box Box::Full(const Shape& shape) { return Box{std::vector<Index>(shape.size(), 0), shape}; }

Shape Box::shape() const {
  Shape s(rank());
  for (size_t d = 0; d < rank(); ++d) s[d] = std::max<Index>(0, end[d] - begin[d]);
  return s;
}

Index Box::volume() const { return NumElements(shape()); }

std::string Box::ToString() const {
  std::string s = "[";
  for (size_t d = 0; d < rank(); ++d) {
    if (d) s += ", ";
    s += std::to_string(begin[d]) + ":" + std::to_string(end[d]);
  }
  return s + "]";
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  assert(a.rank() == b.rank());
  Box r;
  r.begin.resize(a.rank());
  r.end.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    r.begin[d] = std::max(a.begin[d], b.begin[d]);
    r.end[d] = std::min(a.end[d], b.end[d]);
    if (r.begin[d] >= r.end[d]) return std::nullopt;
  }
  return r;
}

bool Contains(const Box& outer, const Box& inner) {
  if (inner.empty()) return true;
  if (outer.rank() != inner.rank()) return false;
  for (size_t d = 0; d < outer.rank(); ++d) {
    if (inner.begin[d] < outer.begin[d] || inner.end[d] > outer.end[d]) return false;
  }
  return true;
}

std::vector<Box> Subtract(const Box& a, const Box& b) {
  auto common = Intersect(a, b);
  if (!common) return {a};
  std::vector<Box> out;
  Box rest = a;  // shrinks dimension by dimension towards the common part
  for (size_t d = 0; d < a.rank(); ++d) {
    if (rest.begin[d] < common->begin[d]) {
      Box lo = rest;
      lo.end[d] = common->begin[d];
      out.push_back(lo);
    }
    if (common->end[d] < rest.end[d]) {
      Box hi = rest;
      hi.begin[d] = common->end[d];
      out.push_back(hi);
    }
    rest.begin[d] = common->begin[d];
    rest.end[d] = common->end[d];
  }
  return out;
}

Box Translate(const Box& box, const std::vector<Index>& delta) {
  Box r = box;
  for (size_t d = 0; d < box.rank(); ++d) {
    r.begin[d] += delta[d];
    r.end[d] += delta[d];
  }
  return r;
}

Layout DenseLayout(const Box& box, Index offset) { return Layout{offset, RowMajorStrides(box.shape())}; }

void ForEachRun(const Box& region, const Box& src_box, const Layout& src, const Box& dst_box, const Layout& dst,
                const std::function<void(Index, Index, Index)>& fn) {
  const size_t n = region.rank();
  const Shape ext = region.shape();
  if (NumElements(ext) == 0) return;
  Index src0 = src.offset, dst0 = dst.offset;
  for (size_t d = 0; d < n; ++d) {
    src0 += (region.begin[d] - src_box.begin[d]) * src.strides[d];
    dst0 += (region.begin[d] - dst_box.begin[d]) * dst.strides[d];
  }
  if (n == 0) {
    fn(src0, dst0, 1);
    return;
  }
  // Merge trailing dimensions while both layouts stay contiguous: the run is
  // dims [split, n) and the loop goes over dims [0, split).
  size_t split = n - 1;
  Index run = ext[n - 1];
  bool unit = src.strides[n - 1] == 1 && dst.strides[n - 1] == 1;
  if (!unit) run = 1, split = n;  // innermost not contiguous: element by element
  while (unit && split > 0 && src.strides[split - 1] == run && dst.strides[split - 1] == run) {
    --split;
    run *= ext[split];
  }
  if (split == 0) {
    fn(src0, dst0, run);
    return;
  }
  std::vector<Index> idx(split, 0);
  Index s = src0, t = dst0;
  while (true) {
    fn(s, t, run);
    size_t d = split;
    while (d-- > 0) {
      if (++idx[d] < ext[d]) {
        s += src.strides[d];
        t += dst.strides[d];
        break;
      }
      s -= (ext[d] - 1) * src.strides[d];
      t -= (ext[d] - 1) * dst.strides[d];
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

std::vector<std::pair<uint64_t, uint64_t>> ByteRanges(const Box& shard, const Box& sub, size_t elem_size) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  Layout dense = DenseLayout(shard);
  ForEachRun(sub, shard, dense, shard, dense, [&](Index s, Index, Index count) {
    uint64_t off = static_cast<uint64_t>(s) * elem_size, len = static_cast<uint64_t>(count) * elem_size;
    if (!out.empty() && out.back().first + out.back().second == off) {
      out.back().second += len;
    } else {
      out.emplace_back(off, len);
    }
  });
  return out;
}

void CopyRegion(const Box& region, const void* src, const Box& src_box, const Layout& src_layout, void* dst,
                const Box& dst_box, const Layout& dst_layout, size_t elem_size) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* t = static_cast<unsigned char*>(dst);
  ForEachRun(region, src_box, src_layout, dst_box, dst_layout, [&](Index a, Index b, Index count) {
    std::memcpy(t + b * elem_size, s + a * elem_size, count * elem_size);
  });
}

std::vector<Box> FlatRangeToBoxes(const Shape& shape, Index first, Index last) {
  std::vector<Box> out;
  const size_t n = shape.size();
  if (first >= last) return out;
  if (n == 0) {
    out.push_back(Box{});
    return out;
  }
  const std::vector<Index> strides = RowMajorStrides(shape);
  auto coords = [&](Index flat) {
    std::vector<Index> c(n);
    for (size_t d = 0; d < n; ++d) {
      c[d] = flat / strides[d];
      flat %= strides[d];
    }
    return c;
  };
  // Greedy: from `pos`, take the largest aligned block that fits before `last`.
  Index pos = first;
  while (pos < last) {
    std::vector<Index> c = coords(pos);
    // Find the outermost dim d such that pos is aligned to strides[d] (all
    // coordinates after d are zero) and at least one step of d fits.
    size_t d = n - 1;
    for (size_t k = 0; k < n; ++k) {
      bool aligned = pos % strides[k] == 0;
      if (aligned && pos + strides[k] <= last) {
        d = k;
        break;
      }
    }
    Index steps = std::min(shape[d] - c[d], (last - pos) / strides[d]);
    Box b;
    b.begin = c;
    b.end = c;
    for (size_t k = 0; k < n; ++k) b.end[k] = k < d ? c[k] + 1 : (k == d ? c[d] + steps : shape[k]);
    out.push_back(b);
    pos += steps * strides[d];
  }
  return out;
}

}  // namespace ptc
