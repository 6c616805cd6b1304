#include "ptc/base/crc32.h"

#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <string>

namespace ptc {

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  // libdeflate's: carry-less multiplication (PCLMULQDQ) where the CPU has
  // it, 4.8 GB/s here against zlib 1.2.13's 1.3 GB/s (Debian 12), the same
  // values; the commit of a save checks every member's CRC with it.
  return libdeflate_crc32(crc, data, n);
}

uint32_t Crc32Combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
  return static_cast<uint32_t>(crc32_combine64(crc1, crc2, static_cast<z_off64_t>(len2)));
}

uint32_t Crc32Zeros(uint64_t n) {
  static const std::string kZeros(4096, '\0');
  uint32_t crc = 0;
  uint64_t have = 0;  // crc covers `have` zeros
  uint32_t block = Crc32(0, kZeros.data(), kZeros.size());
  uint64_t block_len = kZeros.size();
  // Binary decomposition of n / 4096 with doubling blocks, then the remainder.
  uint64_t blocks = n / block_len;
  while (blocks > 0) {
    if (blocks & 1) {
      crc = Crc32Combine(crc, block, block_len);
      have += block_len;
    }
    blocks >>= 1;
    if (blocks > 0) {
      block = Crc32Combine(block, block, block_len);
      block_len *= 2;
    }
  }
  return Crc32(crc, kZeros.data(), n - have);
}

}  // namespace ptc
