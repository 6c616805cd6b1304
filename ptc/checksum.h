// Shard checksums: xxh64 (seed 0) over a shard's bytes, as in the manifest.
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

#include "ptc/status.h"

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

// "xxh64:%016x".
std::string ChecksumToString(uint64_t checksum);
// Inverse of ChecksumToString.
// \error InvalidArgument when the text is not "xxh64:" and 16 hex digits (names the text).
Result<uint64_t> ParseChecksum(std::string_view text);

}  // namespace ptc
