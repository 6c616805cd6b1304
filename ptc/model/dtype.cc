#include "ptc/model/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace ptc {
namespace {

struct Info {
  DType type;
  std::string_view name;
  size_t size;
  bool is_float;
};

constexpr std::array<Info, kNumDTypes> kInfo = {{
    {DType::kF64, "F64", 8, true},
    {DType::kF32, "F32", 4, true},
    {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},
    {DType::kI64, "I64", 8, false},
    {DType::kI32, "I32", 4, false},
    {DType::kI16, "I16", 2, false},
    {DType::kI8, "I8", 1, false},
    {DType::kU8, "U8", 1, false},
    {DType::kBool, "BOOL", 1, false},
    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true},
}};

const Info& Get(DType t) { return kInfo[static_cast<size_t>(t)]; }

}  // namespace

size_t DTypeSize(DType t) { return Get(t).size; }
std::string_view DTypeName(DType t) { return Get(t).name; }
bool IsFloat(DType t) { return Get(t).is_float; }

Result<DType> ParseDType(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (const Info& info : kInfo) {
    if (info.name == upper) return info.type;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "' (expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2)");
}

}  // namespace ptc
