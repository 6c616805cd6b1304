// The zip members' CRC-32 checks of archives that another pass reads whole
// anyway (a save's commit reads every tensor once for its checksums): that
// pass hands over each byte range it read (Add: the CRC of the bytes at hand,
// while they are in the cache), and Verify reads only what no range covered
// (the pickle, bytes of a storage that no tensor views) and combines the rest
// (Crc32Combine). So each byte of a file is read once, not once for the CRCs
// and once more for the checksums.
//
// Thread safety: all methods lock; one ledger may serve several readers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/mutex.h"
#include "ptc/base/status.h"
#include "ptc/format/zip_reader.h"

namespace ptc {

class CrcLedger {
 public:
  // The archive at `path` is to be checked, its members as ReadZipDirectory
  // found them (again for a path already expected: nothing changes).
  void Expect(const std::string& path, const std::vector<ZipEntry>& members) EXCLUDES(mu_);
  // `n` bytes of `path` at `offset` (read by the caller into `data`): their
  // CRC is kept when `path` is expected and they lie inside one member's data
  // and overlap no range kept; otherwise nothing happens.
  void Add(const std::string& path, uint64_t offset, const void* data, size_t n) EXCLUDES(mu_);
  // Checks every member of every archive expected: the kept ranges combined,
  // the rest read from the file (opened in `env`). Each file is checked once
  // (a second Verify checks only archives expected since).
  // \error Corruption "bad CRC-32 in member X of PATH (computed, recorded)";
  //        as Env::OpenRead and RandomAccessFile::Read.
  Status Verify(Env* env) EXCLUDES(mu_);

 private:
  struct Range {
    uint64_t size;
    uint32_t crc;
  };
  struct Archive {
    std::vector<ZipEntry> members;     // by data_offset
    std::map<uint64_t, Range> ranges;  // by offset: disjoint, each inside one member
    bool verified = false;
  };
  // The member's CRC from its kept ranges and its other bytes read from `file` into `buf` (kCrcChunk bytes).
  static Result<uint32_t> MemberCrc(const Archive& archive, const ZipEntry& member, const RandomAccessFile& file,
                                    char* buf);

  Mutex mu_;
  std::map<std::string, Archive> archives_ GUARDED_BY(mu_);
};

}  // namespace ptc
