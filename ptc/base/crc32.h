// CRC-32 as zip records it (zlib's crc32): of a buffer, of two buffers joined,
// and of a run of zero bytes, so that a lazy writer can compute a member's
// CRC without reading it twice.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ptc {

// zlib's crc32: the CRC-32 of `n` bytes continuing `crc` (start with 0),
// computed by libdeflate (vectorised).
uint32_t Crc32(uint32_t crc, const void* data, size_t n);
// zlib's crc32_combine64: the CRC-32 of A then B from crc(A), crc(B) and |B|.
uint32_t Crc32Combine(uint32_t crc1, uint32_t crc2, uint64_t len2);
// The CRC-32 of `n` zero bytes, in O(log n).
uint32_t Crc32Zeros(uint64_t n);

}  // namespace ptc
