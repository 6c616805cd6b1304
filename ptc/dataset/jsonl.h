// JSONL datasets: one sample per line. Sample i is the i-th line that is not
// blank (only spaces, tabs or CR), without its line end ("\n" or "\r\n"). Lines
// are not parsed as JSON.
//
// Import scans the file once and writes a line-offset index. The index lives in
// the store (STORE/dataset/jsonl-<16 hex digits>.index, named by its checksum;
// docs/dataset_format.md), never next to the source, which may be read-only:
//   offset 0   magic "PTCJSONL"       8 bytes
//          8   version                u64 = 1
//         16   source size            u64 (bytes of the .jsonl)
//         24   sample count N         u64
//         32   (start, end) pairs     u64[2N]: sample i = source bytes [start, end)
// The fingerprint checksum is xxh64 of the pairs (bytes 32 to the end).
//
// Thread safety: JsonlIndex is immutable after Open.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/dataset/idx.h"

namespace ptc {

inline constexpr std::string_view kJsonlIndexMagic = "PTCJSONL";
inline constexpr uint64_t kJsonlIndexHeaderSize = 32;

struct JsonlScan {
  uint64_t num_samples = 0;
  uint64_t source_size = 0;
  uint64_t checksum = 0;  // xxh64 of the (start, end) pairs
};

// Scans `jsonl_path`. When `index_path` is not empty, writes the index there
// (through index_path + ".tmp", renamed into place). `progress` gets the bytes
// scanned (may be empty).
// \error NotFound / IOError from the Env.
Result<JsonlScan> ScanJsonl(Env* env, const std::string& jsonl_path, const std::string& index_path,
                            const std::function<void(uint64_t)>& progress = {});

// A validated index image (not owned).
class JsonlIndexView {
 public:
  uint64_t num_samples() const { return n_; }
  // REQUIRES: i < num_samples().
  uint64_t start(uint64_t i) const;
  uint64_t end(uint64_t i) const;
  // Checksum of the pairs, as in JsonlScan.
  uint64_t checksum() const;

 private:
  friend Result<JsonlIndexView> ParseJsonlIndex(std::string_view, std::span<const uint8_t>, uint64_t);
  const uint8_t* pairs_ = nullptr;
  uint64_t n_ = 0;
};

// Validates an index image against the size of its source; never reads outside
// `bytes`. `label` (the index path) starts every message.
// \error Corruption when it is truncated, has the wrong magic or version, was
//        built for a source of another size, its count does not match its size,
//        or a sample's range is reversed, overlaps the previous one or leaves the
//        source ("sample i: ...").
Result<JsonlIndexView> ParseJsonlIndex(std::string_view label, std::span<const uint8_t> bytes, uint64_t source_size);

class JsonlIndex {
 public:
  // \error NotFound / IOError from the Env; Corruption as ParseJsonlIndex.
  static Result<std::unique_ptr<JsonlIndex>> Open(Env* env, const std::string& path, uint64_t source_size);
  const JsonlIndexView& view() const { return view_; }

 private:
  JsonlIndex() = default;
  std::unique_ptr<FileImage> image_;
  JsonlIndexView view_;
};

}  // namespace ptc
