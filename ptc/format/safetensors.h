// The safetensors format: header parsing and a streaming writer.
//
// A file is an 8-byte little-endian length N, N bytes of a UTF-8 JSON object
// (the header), then the data buffer. Each header key but "__metadata__" (an
// optional string -> string map) names a tensor:
//   {"dtype": "F32", "shape": [2, 4], "data_offsets": [begin, end]}
// with offsets relative to the data buffer, which starts at 8 + N. The
// tensors tile the buffer exactly: no gaps, no overlaps, no trailing bytes.
// Our writer pads the JSON with spaces so that 8 + N is a multiple of 8;
// readers accept any N. Format notes: docs/safetensors_and_npy.md.
//
// Every error message begins with the label (the file path) and names the
// tensor at fault. Malformed content is InvalidArgument.
//
// Thread safety: the free functions are pure or only use `env`; a writer is
// used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"

namespace ptc {

// Largest header we read (as the reference implementation: 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t offset;  // absolute, from the start of the file
  uint64_t nbytes;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order (by offset, then name)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N
  uint64_t file_size = 0;

  // nullptr when there is no tensor of that name. A linear search: index
  // `tensors` by name for many look-ups (RankCheckpoint::Open does).
  const SafetensorsEntry* Find(std::string_view name) const;
};

// Parses the header of a file of `file_size` bytes whose first bytes are
// `prefix`. Pure and safe on any input (the fuzz target calls it).
// \error InvalidArgument when the file is shorter than 8 bytes; N exceeds the
//        file or kMaxSafetensorsHeaderSize; the header is not JSON or not an
//        object; a key repeats; "__metadata__" is not a map of strings; a
//        tensor lacks dtype, shape or data_offsets, has an unknown dtype, a
//        dimension that is not an integer >= 0, a byte size that overflows,
//        offsets that disagree with its shape; the tensors do not tile the
//        data buffer (gap, overlap, beyond the end, trailing bytes).
// \error InvalidArgument when `prefix` holds fewer than 8 + N bytes or more
//        than `file_size`.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view label, std::string_view prefix, uint64_t file_size);

// Reads the 8-byte length, then the N header bytes, and parses them.
// \error as ParseSafetensorsHeader, labelled with `path`.
// \error as Env::OpenRead and RandomAccessFile::Read.
Result<SafetensorsHeader> ReadSafetensorsHeader(Env* env, const std::string& path);

// The header bytes (length, JSON, space padding to a multiple of 8) of a file
// holding `tensors` in the given order, data packed without gaps.
// \error InvalidArgument for an empty or repeated name, the name
//        "__metadata__", a name or metadata text that is not UTF-8, a negative
//        dimension, or a byte size that overflows.
Result<std::string> EncodeSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                            const std::map<std::string, std::string>& metadata);

// Writes a safetensors file as a stream: Create writes the header, Append
// adds the tensors' bytes in the order of `tensors` (any chunking), Finish
// checks that every byte came, syncs and closes. The file is written in place;
// a writer dropped before Finish leaves a partial file behind.
class SafetensorsWriter {
 public:
  // \error as EncodeSafetensorsHeader (labelled with `path`) and Env::OpenWrite.
  static Result<std::unique_ptr<SafetensorsWriter>> Create(Env* env, const std::string& path,
                                                           std::vector<TensorSpec> tensors,
                                                           std::map<std::string, std::string> metadata);
  // The file `name` of an output tree (OutputDir::NewWritableFile: created
  // new in its directory, never through a link).
  // \error as EncodeSafetensorsHeader and OutputDir::NewWritableFile.
  static Result<std::unique_ptr<SafetensorsWriter>> Create(OutputDir& dir, const std::string& name,
                                                           std::vector<TensorSpec> tensors,
                                                           std::map<std::string, std::string> metadata);
  ~SafetensorsWriter();

  // \error FailedPrecondition when `n` bytes go past the last tensor or after Finish.
  // \error as WritableFile::Append.
  Status Append(const void* data, size_t n);
  // \error FailedPrecondition naming the first tensor not completely written.
  // \error as WritableFile::Sync and Close.
  Status Finish();

  // Where each tensor lands; data_start is the header size.
  const SafetensorsHeader& header() const { return header_; }

 private:
  SafetensorsWriter(std::string path, SafetensorsHeader header, std::unique_ptr<WritableFile> file);
  // Checks the header, then opens the file at `path` with `open`.
  static Result<std::unique_ptr<SafetensorsWriter>> Start(
      const std::string& path, const std::vector<TensorSpec>& tensors,
      const std::map<std::string, std::string>& metadata,
      const std::function<Result<std::unique_ptr<WritableFile>>()>& open);

  std::string path_;
  SafetensorsHeader header_;
  std::unique_ptr<WritableFile> file_;
  uint64_t written_;  // bytes in the file so far, header included
  bool finished_ = false;
};

}  // namespace ptc
