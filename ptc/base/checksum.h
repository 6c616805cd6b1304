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
};

// Hashes a shard's bytes in order, block by block. Used by one thread at a time.
class ShardHasher {
 public:
  void Update(const void* data, size_t n);
  // The digest of everything hashed so far (the hasher is spent).
  ShardDigest Finish();

 private:
  Xxh64Stream block_;
  uint64_t in_block_ = 0;  // bytes of the current block hashed
  std::vector<uint64_t> blocks_;
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

}  // namespace ptc
