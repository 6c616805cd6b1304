// Reading stored (uncompressed) zip archives, the container of torch.save
// files: the central directory of an archive (ours, torch's, Python
// zipfile's) is parsed and each member's data located; the data itself is
// read by the caller. Format notes: docs/torch_format.md. Writing archives is
// zip_writer.h.
//
// Every error message names the archive (`what`, usually its path) and the
// member or record at fault. Malformed content is InvalidArgument; a CRC
// mismatch is Corruption.
//
// Thread safety: the functions only read `file`; results are values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc {

struct ZipEntry {
  std::string name;
  uint64_t header_offset = 0;  // of the local header
  uint64_t data_offset = 0;    // of the member's data (after the local header)
  uint64_t size = 0;           // bytes of data
  uint32_t crc32 = 0;          // from the central directory
  uint16_t method = 0;         // always 0 (stored) in an archive we accept
};

struct ZipArchive {
  std::vector<ZipEntry> members;  // in central directory order
  bool zip64 = false;

  // nullptr when there is no member of that name.
  const ZipEntry* Find(std::string_view name) const;
};

// Largest central directory we read into memory.
inline constexpr uint64_t kMaxZipDirectorySize = 1ull << 30;

// Parses the end records and the central directory of `file`, and each local
// header (to locate the data).
// \error InvalidArgument, naming `what`, when: there is no end of central
//        directory record (searched in the last 64 KiB + 22 bytes); the
//        archive spans disks; a ZIP64 locator or record is truncated or
//        malformed; the directory lies outside the file, exceeds
//        kMaxZipDirectorySize or disagrees with its entry count; an entry is
//        truncated, encrypted, compressed (ptcfs reads stored members only),
//        has a repeated name, sizes that disagree, a local header that is
//        missing, truncated or names another member; a member's data runs
//        past the central directory or overlaps another member.
// \error as RandomAccessFile::Read.
Result<ZipArchive> ReadZipDirectory(const RandomAccessFile& file, const std::string& what);

// Reads the member's data in chunks of kCrcChunk bytes and checks its CRC-32.
// `buf`: a buffer of kCrcChunk bytes to read into (one for many members: no
// allocation, no zeroing per member); null: one of its own.
// \error Corruption "bad CRC-32 in member X of WHAT" on a mismatch.
// \error as RandomAccessFile::Read.
inline constexpr size_t kCrcChunk = 1 << 20;
Status VerifyMemberCrc(const RandomAccessFile& file, const ZipEntry& member, const std::string& what,
                       char* buf = nullptr);
// The CRC-32 `computed` over the member's data against the one recorded.
// \error Corruption "bad CRC-32 in member X of WHAT (computed, recorded)" when they differ.
Status CheckMemberCrc(const ZipEntry& member, uint32_t computed, const std::string& what);

}  // namespace ptc
