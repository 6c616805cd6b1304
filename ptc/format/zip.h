// Stored (uncompressed) zip archives, the container of torch.save files.
//
// Writing is a pure layout: PlanZip turns a member list {name, size, crc32}
// into the exact byte layout of the archive, a list of pieces that are either
// literal bytes (local headers with their alignment padding, the central
// directory, the end records) or a range of one member's data. A lazy renderer
// (the mount) serves any byte range of the archive from the layout without
// materialising it; WriteZip streams it into a file. Format notes, ZIP64 rules
// and alignment: docs/torch_format.md.
//
// Reading parses the central directory of a stored archive (ours, torch's,
// Python zipfile's) and locates each member's data; the data itself is read by
// the caller.
//
// Every error message names the archive (`what`, usually its path) and the
// member or record at fault. Malformed content is InvalidArgument; a CRC
// mismatch is Corruption.
//
// Thread safety: all functions are pure or only read `file`; layouts are
// values, safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc {

// zlib's crc32: the CRC-32 of `n` bytes continuing `crc` (start with 0).
uint32_t Crc32(uint32_t crc, const void* data, size_t n);
// zlib's crc32_combine64: the CRC-32 of A then B from crc(A), crc(B) and |B|.
uint32_t Crc32Combine(uint32_t crc1, uint32_t crc2, uint64_t len2);
// The CRC-32 of `n` zero bytes, in O(log n).
uint32_t Crc32Zeros(uint64_t n);

// Data of every member starts at a multiple of this (as torch writes).
inline constexpr uint64_t kZipAlignment = 64;

struct ZipMember {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

// A byte range [offset, offset + size) of the archive.
struct ZipPiece {
  uint64_t offset = 0;
  uint64_t size = 0;
  // -1: the bytes are `literal`. Else the bytes are those of member `member`
  // from `member_offset` on.
  int64_t member = -1;
  uint64_t member_offset = 0;
  std::string literal;

  bool is_literal() const { return member < 0; }
};

struct ZipLayout {
  uint64_t size = 0;                   // of the whole archive
  std::vector<ZipPiece> pieces;        // ordered, covering [0, size) exactly
  std::vector<uint64_t> data_offsets;  // per member: where its data starts
  bool zip64 = false;                  // ZIP64 end records were needed

  // The index of the piece holding byte `offset`. REQUIRES: offset < size.
  size_t FindPiece(uint64_t offset) const;
};

// For tests only: lower the thresholds above which ZIP64 fields are used
// (a size or offset >= size_limit, an entry count >= count_limit).
struct ZipLimits {
  uint64_t size_limit = 0xFFFFFFFFull;
  uint64_t count_limit = 0xFFFF;
};

// The layout of a stored archive holding `members` in the given order:
// local header (+ ZIP64 extra + padding extra so the data is 64-aligned),
// data, ... central directory, [ZIP64 end record and locator], end record.
// Deterministic: DOS time fixed at 1980-01-01 00:00, no comment.
// \error InvalidArgument for an empty name, a name over 65535 bytes or with a
//        NUL, a repeated name (messages name the member).
Result<ZipLayout> PlanZip(const std::vector<ZipMember>& members, const ZipLimits& limits = {});

// Supplies `n` bytes of member `member` from `offset` on into `dst`.
using ZipDataReader = std::function<Status(size_t member, uint64_t offset, size_t n, void* dst)>;

// Copies bytes [offset, offset + n) of the archive into dst: literal pieces
// from the layout, data through `read`. What a lazy renderer calls per read.
// \error InvalidArgument when the range passes the end of the archive.
// \error whatever `read` returns.
Status ReadZipRange(const ZipLayout& layout, uint64_t offset, size_t n, void* dst, const ZipDataReader& read);

// Streams the archive of `members` into `out`, reading member data
// through `read` in chunks of at most 1 MiB. The members' crc32 fields are
// ignored: CRCs are computed while streaming and the headers holding them are
// rewritten in place (PWrite) at the end. Returns the final layout.
// REQUIRES: `out` is empty (the archive starts at its offset 0).
// \error as PlanZip; whatever `read` and `out` return.
Result<ZipLayout> WriteZip(WritableFile& out, std::vector<ZipMember> members, const ZipDataReader& read,
                           const std::string& what);

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

// Reads the member's data in chunks of at most 1 MiB and checks its CRC-32.
// \error Corruption "bad CRC-32 in member X of WHAT" on a mismatch.
// \error as RandomAccessFile::Read.
Status VerifyMemberCrc(const RandomAccessFile& file, const ZipEntry& member, const std::string& what);

}  // namespace ptc
