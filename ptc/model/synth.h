// Synthetic tensor values: a deterministic function of (tensor name, seed,
// element index) only, so the same model synthesised under two parallel
// configs has the same global tensors. It is the reference the tests and
// benchmarks compare against.
//
// Floating types get finite values of both signs; integer types random bits;
// BOOL 0 or 1. Adam state is what an Adam step accepts (view.h names it): for
// a parameter P, "P.exp_avg_sq" is never negative, and the F32 master copy
// "P.fp32" holds P's own elements (of the parameters' dtype) widened to F32,
// F64 rounded to nearest; so a first step from synthetic state is finite.
#pragma once

#include <cstdint>
#include <string_view>

#include "ptc/model/box.h"
#include "ptc/model/dtype.h"

namespace ptc {

inline constexpr std::string_view kMasterSuffix = ".fp32";
inline constexpr std::string_view kSecondMomentSuffix = ".exp_avg_sq";

// Writes elements [first, first + count) (row-major flat indices of the
// global tensor) to `out`, which holds count * DTypeSize(dtype) bytes.
// `param_dtype` is the dtype of the model's parameters: it decides the values
// of a master copy "P.fp32" (dtype F32) and nothing else.
void SynthValues(std::string_view tensor, uint64_t seed, DType dtype, Index first, Index count, void* out,
                 DType param_dtype);

}  // namespace ptc
