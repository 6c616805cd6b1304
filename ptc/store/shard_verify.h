// Reading a stored shard's bytes and checking them against the manifest's
// per-block checksums (ptc/base/checksum.h): a byte range, a whole shard, a
// whole generation, or a shard streamed front to back and checked as it goes.
//
// Thread safety: the free functions may be called from any thread; a
// VerifyingShardReader is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "ptc/base/checksum.h"
#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store.h"

namespace ptc {

// Reads n bytes at `offset_in_shard` of a shard's data.
// \error InvalidArgument when the range leaves the shard.
// \error NotFound / IOError / Corruption from the Env (a short file), naming the file.
Status ReadShardBytes(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset_in_shard, size_t n,
                      void* dst);

// Reads one shard's bytes front to back from the start of a checksum block
// and checks each block as its last byte is read, so that a caller that
// consumes a shard in order (the transform executor) checks its checksums
// without reading it a second time. Used by one thread at a time.
class VerifyingShardReader {
 public:
  // Starts at block `block` (manifest.h: BlockBegin). `shard` must outlive the reader.
  // \error InvalidArgument when the shard has no such block; NotFound / IOError from the Env.
  static Result<std::unique_ptr<VerifyingShardReader>> Open(Env* env, const Store& store, const ShardRecord& shard,
                                                            size_t block = 0);
  ~VerifyingShardReader();

  const ShardRecord& shard() const { return shard_; }
  // Offset in the shard of the next byte to read.
  uint64_t position() const { return pos_; }

  // Reads the next n bytes of the shard into dst.
  // \error InvalidArgument when that goes past the shard's end.
  // \error Corruption naming the tensor, its boxes, the file (and the block) when a block
  //        completed by these bytes does not match its checksum, or the file is short;
  //        IOError from the Env.
  Status Read(size_t n, void* dst);
  // The next n bytes of the shard, checked as Read does, without copying them
  // where possible: a pointer into a read-only mapping of the file (a window of
  // a few MiB) when the Env's file has a descriptor, else `scratch` (at least n
  // bytes) filled by Read. Valid until the next call or the reader's end. A
  // mapped file that another process truncates meanwhile raises SIGBUS: shard
  // files are immutable.
  // \error as Read.
  Result<const char*> Next(size_t n, char* scratch);
  // Checks that the whole shard was read (every block was checked on the way).
  // \error Corruption naming the tensor, its boxes and the file when fewer than
  //        shard().nbytes bytes were read, or the empty shard's checksum differs.
  Status Finish();

 private:
  VerifyingShardReader(const ShardRecord& shard, std::unique_ptr<RandomAccessFile> file, size_t block);
  Status Consume(const char* p, size_t n);
  bool MapWindow(size_t n);
  const ShardRecord& shard_;
  std::unique_ptr<RandomAccessFile> file_;
  BlockHasher hasher_;
  uint64_t pos_;         // the next byte's offset in the shard
  const bool hashed_;    // false: the file checks what it reads (RandomAccessFile::VerifiesBlocks)
  bool mappable_;        // fd, large enough, file not short
  char* map_ = nullptr;  // mapping of file bytes [map_begin_, map_begin_ + map_len_)
  uint64_t map_begin_ = 0;
  size_t map_len_ = 0;
};

// Checks the checksum blocks that hold bytes [offset, offset + n) of the shard
// (all of them, and the shard's end, when the range is the whole shard).
// \error InvalidArgument when the range leaves the shard.
// \error Corruption naming the tensor, its boxes, the file and the block when a checksum
//        differs or the file is short; NotFound / IOError from the Env.
Status VerifyShardRange(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset, uint64_t n);

// VerifyShardRange over `file`, an open file of the shard (its bytes at
// shard.offset), so that the bytes checked are those of the descriptor a
// caller serves from; nothing to do for a file that checks what it reads
// (RandomAccessFile::VerifiesBlocks). With a descriptor the blocks are hashed from a
// read-only mapping of the file (no copy; a mapped file that another process
// truncates meanwhile raises SIGBUS: shard files are immutable, and the size
// is checked first); without one, or when the file is short, they are read
// with RandomAccessFile::Read.
// \error as VerifyShardRange (Corruption for a short file, naming the shard).
Status VerifyShardRangeInFile(const RandomAccessFile& file, const ShardRecord& shard, uint64_t offset, uint64_t n);

// VerifyShardRange over the whole shard.
Status VerifyShard(Env* env, const Store& store, const ShardRecord& shard);

// The shard records of `m` with one record per stored piece (file, offset,
// bytes): a covering may list one piece for several workers. Manifest order.
std::vector<const ShardRecord*> DistinctPieces(const GenerationManifest& m);

// VerifyShard, and CheckH5Shard when `check_hdf5`, for DistinctPieces(m);
// then VerifyShard of every copy in a rank file (CopyRecords).
// \error the first failure, as VerifyShard / CheckH5Shard.
Status VerifyGeneration(const Store& store, const GenerationManifest& m, bool check_hdf5 = true);

}  // namespace ptc
