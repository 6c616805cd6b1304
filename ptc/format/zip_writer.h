// Writing stored (uncompressed) zip archives, the container of torch.save
// files.
//
// Writing is a pure layout: PlanZip turns a member list {name, size, crc32}
// into the exact byte layout of the archive, a list of pieces that are either
// literal bytes (local headers with their alignment padding, the central
// directory, the end records) or a range of one member's data. A lazy renderer
// (the mount) serves any byte range of the archive from the layout without
// materialising it (ReadZipRange); WriteZip streams it into a file. Format
// notes, ZIP64 rules and alignment: docs/torch_format.md. Reading archives is
// zip_reader.h.
//
// PlanZip's errors name the member at fault, WriteZip's also the archive
// (`what`, usually its path). Malformed input is InvalidArgument.
//
// Thread safety: all functions are pure; layouts are values, safe to share
// between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/base/crc32.h"  // ZipMember::crc32 is a Crc32 of the member's data

namespace ptc {

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

}  // namespace ptc
