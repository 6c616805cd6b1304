#include "ptc/model/synth.h"

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

}  // namespace

void SynthValues(std::string_view tensor, uint64_t seed, DType dtype, Index first, Index count, void* out) {
  const uint64_t key = SplitMix(Fnv1a(tensor) ^ SplitMix(seed));
  for (Index i = 0; i < count; ++i) {
    const uint64_t x = SplitMix(key + static_cast<uint64_t>(first + i));
    const float f = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
    switch (dtype) {
      case DType::kF64:
        Store(out, i, static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0);
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
  }
}

}  // namespace ptc
