// Element types. Every dtype is carried bit-exact: ptcfs never converts
// values, it only moves bytes, so bf16 and fp8 need no arithmetic support.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc {

enum class DType : unsigned char {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
};
inline constexpr int kNumDTypes = 12;

// Bytes per element.
size_t DTypeSize(DType t);
// The safetensors spelling: "F64", "BF16", "F8_E4M3", "BOOL", ...
std::string_view DTypeName(DType t);
// Accepts the safetensors spelling, case-insensitively ("bf16", "F8_E4M3").
// \error InvalidArgument for anything else, naming the text.
Result<DType> ParseDType(std::string_view name);
bool IsFloat(DType t);

}  // namespace ptc
