// Internal to ptc/format: the little-endian integers of the on-disk formats
// (zip records, pickle opcode arguments), encoded and decoded in one place.
// Not part of the public interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ptc::internal {

// The unsigned integer stored least significant byte first in `bytes`.
// REQUIRES: bytes.size() <= 8.
inline uint64_t GetLittleEndian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t k = bytes.size(); k-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[k]);
  return v;
}

// Appends the low `n` bytes of `v`, least significant first. REQUIRES: n <= 8.
inline void PutLittleEndian(std::string& out, uint64_t v, size_t n) {
  for (size_t k = 0; k < n; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

// Fixed widths. Get* REQUIRE that `p` points to at least 2, 4 or 8 bytes.
inline uint16_t Get16(const char* p) { return static_cast<uint16_t>(GetLittleEndian({p, 2})); }
inline uint32_t Get32(const char* p) { return static_cast<uint32_t>(GetLittleEndian({p, 4})); }
inline uint64_t Get64(const char* p) { return GetLittleEndian({p, 8}); }
inline void Put16(std::string& out, uint16_t v) { PutLittleEndian(out, v, 2); }
inline void Put32(std::string& out, uint32_t v) { PutLittleEndian(out, v, 4); }
inline void Put64(std::string& out, uint64_t v) { PutLittleEndian(out, v, 8); }

}  // namespace ptc::internal
