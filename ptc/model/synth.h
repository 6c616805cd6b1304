// Synthetic tensor values: a deterministic function of (tensor name, seed,
// element index) only, so the same model synthesised under two parallel
// configs has the same global tensors. It is the reference the tests and
// benchmarks compare against.
//
// Floating types get finite values of both signs; integer types random bits;
// BOOL 0 or 1.
#pragma once

#include <cstdint>
#include <string_view>

#include "ptc/model/box.h"
#include "ptc/model/dtype.h"

namespace ptc {

// Writes elements [first, first + count) (row-major flat indices of the
// global tensor) to `out`, which holds count * DTypeSize(dtype) bytes.
void SynthValues(std::string_view tensor, uint64_t seed, DType dtype, Index first, Index count, void* out);

}  // namespace ptc
