#include "ptc/model/synth.h"

#include <cmath>
#include <cstring>

namespace ptc {
namespace {

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Sign bit, a biased exponent in [1, max_exp] and random mantissa bits:
// always a normal, finite number.
uint32_t SmallFloatBits(uint64_t x, int exp_bits, int man_bits, uint32_t max_exp) {
  uint32_t sign = x & 1;
  uint32_t exp = 1 + static_cast<uint32_t>((x >> 1) % max_exp);
  uint32_t man = static_cast<uint32_t>(x >> 16) & ((1u << man_bits) - 1);
  return (sign << (exp_bits + man_bits)) | (exp << man_bits) | man;
}

template <typename T>
void Store(void* out, Index i, T v) {
  std::memcpy(static_cast<unsigned char*>(out) + i * sizeof(T), &v, sizeof(T));
}

uint64_t Key(std::string_view tensor, uint64_t seed) { return SplitMix(Fnv1a(tensor) ^ SplitMix(seed)); }

// The F32 value behind element x of every floating type but F64 and the
// small ones: uniform in [-1, 1).
float UnitFloat(uint64_t x) {
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
}

double UnitDouble(uint64_t x) { return static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0; }

// The value of SmallFloatBits(x, exp_bits, man_bits, max_exp) (always a
// normal number, exactly representable in F32).
float SmallFloatValue(uint64_t x, int exp_bits, int man_bits, uint32_t max_exp) {
  const uint32_t bits = SmallFloatBits(x, exp_bits, man_bits, max_exp);
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const float v = std::ldexp(1.0f + static_cast<float>(man) / static_cast<float>(1u << man_bits),
                             static_cast<int>(exp) - bias);
  return (bits >> (exp_bits + man_bits)) & 1 ? -v : v;
}

// Element x of a parameter of `dtype` widened to F32 (F64 rounded), as a
// master copy holds it.
float MasterValue(uint64_t x, DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return static_cast<float>(UnitDouble(x));
    case DType::kF32:
      return UnitFloat(x);
    case DType::kBF16: {
      const float f = UnitFloat(x);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits &= 0xffff0000u;
      float out;
      std::memcpy(&out, &bits, 4);
      return out;
    }
    case DType::kF16:
      return SmallFloatValue(x, 5, 10, 29);
    case DType::kF8E4M3:
      return SmallFloatValue(x, 4, 3, 14);
    case DType::kF8E5M2:
      return SmallFloatValue(x, 5, 2, 30);
    case DType::kI64:
      return static_cast<float>(static_cast<int64_t>(x));
    case DType::kI32:
      return static_cast<float>(static_cast<int32_t>(x));
    case DType::kI16:
      return static_cast<float>(static_cast<int16_t>(x));
    case DType::kI8:
      return static_cast<float>(static_cast<int8_t>(x));
    case DType::kU8:
      return static_cast<float>(static_cast<uint8_t>(x));
    case DType::kBool:
      return static_cast<float>(x & 1);
  }
  return 0;
}

bool IsFloating(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return true;
    default:
      return false;
  }
}

}  // namespace

void SynthValues(std::string_view tensor, uint64_t seed, DType dtype, Index first, Index count, void* out,
                 DType param_dtype) {
  if (dtype == DType::kF32 && tensor.ends_with(kMasterSuffix)) {
    // The master copy: parameter P's own elements, widened.
    const uint64_t key = Key(tensor.substr(0, tensor.size() - kMasterSuffix.size()), seed);
    for (Index i = 0; i < count; ++i) {
      Store(out, i, MasterValue(SplitMix(key + static_cast<uint64_t>(first + i)), param_dtype));
    }
    return;
  }
  // Adam's second moment is never negative: the sign bit (every floating
  // type's top bit) cleared.
  const bool non_negative = IsFloating(dtype) && tensor.ends_with(kSecondMomentSuffix);
  const uint64_t key = Key(tensor, seed);
  for (Index i = 0; i < count; ++i) {
    const uint64_t x = SplitMix(key + static_cast<uint64_t>(first + i));
    const float f = UnitFloat(x);
    switch (dtype) {
      case DType::kF64:
        Store(out, i, UnitDouble(x));
        break;
      case DType::kF32:
        Store(out, i, f);
        break;
      case DType::kBF16: {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        Store(out, i, static_cast<uint16_t>(bits >> 16));
        break;
      }
      case DType::kF16:
        Store(out, i, static_cast<uint16_t>(SmallFloatBits(x, 5, 10, 29)));
        break;
      case DType::kF8E4M3:
        Store(out, i, static_cast<uint8_t>(SmallFloatBits(x, 4, 3, 14)));
        break;
      case DType::kF8E5M2:
        Store(out, i, static_cast<uint8_t>(SmallFloatBits(x, 5, 2, 30)));
        break;
      case DType::kI64:
        Store(out, i, static_cast<int64_t>(x));
        break;
      case DType::kI32:
        Store(out, i, static_cast<int32_t>(x));
        break;
      case DType::kI16:
        Store(out, i, static_cast<int16_t>(x));
        break;
      case DType::kI8:
        Store(out, i, static_cast<int8_t>(x));
        break;
      case DType::kU8:
        Store(out, i, static_cast<uint8_t>(x));
        break;
      case DType::kBool:
        Store(out, i, static_cast<uint8_t>(x & 1));
        break;
    }
    if (non_negative) {
      // Little-endian: the top bit is in the element's last byte.
      static_cast<unsigned char*>(out)[(i + 1) * DTypeSize(dtype) - 1] &= 0x7f;
    }
  }
}

}  // namespace ptc
