// Internal to the zip files: the on-disk records that the writer
// (zip_writer.cc) lays out and the reader (zip_reader.cc) parses, named once.
// Record layouts: docs/torch_format.md and PKWARE's APPNOTE.TXT 4.3. Integers
// are little-endian (little_endian.h). Not part of the public interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ptc::internal {

// Record signatures.
inline constexpr uint32_t kLocalSig = 0x04034b50;      // local file header
inline constexpr uint32_t kCentralSig = 0x02014b50;    // central directory entry
inline constexpr uint32_t kEndSig = 0x06054b50;        // end of central directory
inline constexpr uint32_t kEnd64Sig = 0x06064b50;      // ZIP64 end of central directory
inline constexpr uint32_t kLocator64Sig = 0x07064b50;  // ZIP64 end of central directory locator

// Fixed sizes of the records, before their variable fields (name, extra, comment).
inline constexpr size_t kLocalSize = 30;
inline constexpr size_t kCentralSize = 46;
inline constexpr size_t kEndSize = 22;
inline constexpr size_t kEnd64Size = 56;
inline constexpr size_t kLocator64Size = 20;

// Extra field ids.
inline constexpr uint16_t kZip64ExtraId = 0x0001;
inline constexpr uint16_t kPadExtraId = 0x4246;  // "FB", torch's padding field

// Member data is streamed (written, or read back for its CRC) in chunks of at
// most this many bytes.
inline constexpr size_t kChunk = 1 << 20;

// A member name as messages quote it: 'name'.
inline std::string Quote(std::string_view name) {
  std::string quoted = "'";
  quoted.append(name).push_back('\'');
  return quoted;
}

}  // namespace ptc::internal
