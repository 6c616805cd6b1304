// Copying a box region out of a tensor stored in a file (a stored shard, a
// rank's tensor inside a safetensors file) into memory, reading only the
// bytes the region spans, in bounded pieces.
#pragma once

#include <cstdint>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/model/box.h"

namespace ptc {

// Where a tensor's elements live in a file: byte `base` + element address *
// elem_size, with addresses given by `layout` over `box` (see box.h).
struct FileTensor {
  const RandomAccessFile* file;
  uint64_t base;
  Box box;
  Layout layout;
  size_t elem_size;
};

// Copies `region` from `src` into the buffer `dst` laid out by
// (dst_box, dst_layout). Reads spans of at most max_span bytes at a time.
// REQUIRES: region within src.box and dst_box.
// \error as RandomAccessFile::Read.
Status ReadRegion(const FileTensor& src, const Box& region, void* dst, const Box& dst_box, const Layout& dst_layout,
                  uint64_t max_span = 64ull << 20);

}  // namespace ptc
