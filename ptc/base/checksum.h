// Shard checksums, as in the manifest (docs/store_format.md): xxh64 (seed 0)
// of every 4 MiB block of a shard, so that a reader can verify only the
// blocks it reads, and the shard checksum over them. A shard of at most one
// block has no block list: its checksum is the xxh64 of its bytes.
//
// String form in manifests: "xxh64:" followed by exactly 16 lower-case hex
// digits, e.g. "xxh64:ef46db3751d8e999" (the hash of nothing).
//
// Thread safety: the free functions are pure; an Xxh64 object is used by one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"

namespace ptc {

// One-shot xxh64 of n bytes.
uint64_t Xxh64(const void* data, size_t n);

// Streaming xxh64: Update any number of times, Digest at any point (Digest
// does not end the stream).
class Xxh64Stream {
 public:
  Xxh64Stream();
  ~Xxh64Stream();
  Xxh64Stream(const Xxh64Stream&) = delete;
  Xxh64Stream& operator=(const Xxh64Stream&) = delete;

  void Update(const void* data, size_t n);
  uint64_t Digest() const;
  // Back to the hash of nothing.
  void Reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Block size of shard checksums.
inline constexpr uint64_t kChecksumBlockBytes = 4 << 20;

// The checksum of a shard of more than one block: xxh64 of its block
// checksums as little-endian 8-byte words.
uint64_t CombineBlockChecksums(const std::vector<uint64_t>& blocks);

struct ShardDigest {
  uint64_t checksum = 0;
  std::vector<uint64_t> blocks;  // empty for a shard of at most one block
  // The CRC-32 (zip's, crc32.h) of each block, one at least (ShardRecord::block_crc32s).
  std::vector<uint32_t> crc32s{};
};

// Hashes a stream's bytes block by block: blocks of kChecksumBlockBytes from
// the stream's start, the last one ending with the stream: for the reader
// that checks blocks as it reads (store/shard_verify.h, the peer client).
// It, BlockCrcs and ShardHasher cut a stream at block boundaries with one
// walk (checksum.cc). Used by one thread at a time.
class BlockHasher {
 public:
  // Called with a block's index and digest as its last byte is hashed; an
  // error stops Update.
  using BlockDone = std::function<Status(size_t block, uint64_t digest)>;

  // Starts at byte `pos`, the first byte of a block, of a stream of `size`
  // bytes (kUnknownSize: a block ends only at a multiple of kChecksumBlockBytes).
  static constexpr uint64_t kUnknownSize = UINT64_MAX;
  explicit BlockHasher(uint64_t pos = 0, uint64_t size = kUnknownSize);

  // Offset in the stream of the next byte.
  uint64_t position() const { return pos_; }
  // Hashes the next n bytes, calling `done` for every block they complete.
  // \error the first error `done` returns (the bytes after that block are not hashed).
  Status Update(const void* data, size_t n, const BlockDone& done);
  // Digest of the bytes of the current, unfinished block (of nothing when a block just ended).
  uint64_t PartialDigest() const { return block_.Digest(); }
  bool InBlock() const { return pos_ % kChecksumBlockBytes != 0 && pos_ != size_; }

 private:
  Xxh64Stream block_;
  uint64_t pos_;
  const uint64_t size_;
};

// The CRC-32 of each kChecksumBlockBytes block of a stream (the last one
// shorter; one block, of nothing, for an empty stream), so that a zip writer
// composes the CRC of any run of whole blocks without reading it
// (Crc32Combine). Used by one thread at a time.
class BlockCrcs {
 public:
  void Update(const void* data, size_t n);
  // The CRCs of every block so far (the object is spent).
  std::vector<uint32_t> Finish();

 private:
  uint64_t pos_ = 0;
  uint32_t crc_ = 0;             // of the current block's bytes
  std::vector<uint32_t> done_;  // of the blocks completed
};

// Hashes a shard's bytes in order, block by block: xxh64 and CRC-32 of
// each, in one walk over the blocks, each 256 KiB slice hashed by both while
// it is in cache (one pass over memory however large the write). Used by one
// thread at a time.
class ShardHasher {
 public:
  void Update(const void* data, size_t n);
  // The digest of everything hashed so far (the hasher is spent).
  ShardDigest Finish();

 private:
  uint64_t pos_ = 0;
  Xxh64Stream block_;             // of the current block's bytes
  uint32_t crc_ = 0;              // of the current block's bytes
  std::vector<uint64_t> blocks_;  // digests of the blocks completed
  std::vector<uint32_t> crcs_;    // their CRC-32s
};

// "xxh64:%016x".
std::string ChecksumToString(uint64_t checksum);
// Inverse of ChecksumToString.
// \error InvalidArgument when the text is not "xxh64:" and 16 hex digits (names the text).
Result<uint64_t> ParseChecksum(std::string_view text);

// Block checksums as one string of 16 lower-case hex digits each.
std::string BlockChecksumsToString(const std::vector<uint64_t>& blocks);
// Inverse of BlockChecksumsToString.
// \error InvalidArgument when the length is not a multiple of 16 or a digit is not hex.
Result<std::vector<uint64_t>> ParseBlockChecksums(std::string_view text);

// Block CRC-32s as one string of 8 lower-case hex digits each.
std::string BlockCrc32sToString(const std::vector<uint32_t>& crcs);
// Inverse of BlockCrc32sToString.
// \error InvalidArgument when the length is not a multiple of 8 or a digit is not hex.
Result<std::vector<uint32_t>> ParseBlockCrc32s(std::string_view text);

}  // namespace ptc
