// Megatron-LM indexed datasets: PREFIX.idx (the index) + PREFIX.bin (tokens).
//
// .idx, little-endian, packed (docs/dataset_format.md):
//   offset 0   magic "MMIDIDX\0\0"        9 bytes
//          9   version                    u64 = 1
//         17   dtype code                 u8: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16
//         18   sequence count N           u64
//         26   document count D           u64
//         34   sequence lengths (tokens)  int32[N]
//    34 + 4N   byte offsets into .bin     int64[N]
//   34 + 12N   document index             int64[D]  (Megatron: 0, then the end sequence of each document)
//
// Sequence i is the bytes [offset[i], offset[i] + length[i] * dtype size) of .bin.
//
// Thread safety: IdxView and IdxFile are immutable after creation; MegatronWriter
// is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc {

inline constexpr std::string_view kIdxMagic{"MMIDIDX\0\0", 9};
inline constexpr uint64_t kIdxHeaderSize = 34;

// Bytes per token of a dtype code; 0 for an unknown code.
size_t IdxDTypeSize(uint8_t code);
// "uint16", "int32", ...; "unknown" for an unknown code.
std::string_view IdxDTypeName(uint8_t code);
// The code of "u8", "i8", "i16", "i32", "i64", "f64", "f32", "u16" (or "uint8", "int32", ...).
// \error InvalidArgument naming the text.
Result<uint8_t> ParseIdxDType(std::string_view name);

// Where each part of an .idx of n sequences and d documents starts.
struct IdxLayout {
  uint64_t num_sequences = 0;
  uint64_t num_documents = 0;
  uint64_t sizes_offset() const { return kIdxHeaderSize; }
  uint64_t pointers_offset() const { return kIdxHeaderSize + 4 * num_sequences; }
  uint64_t documents_offset() const { return pointers_offset() + 8 * num_sequences; }
  uint64_t total_size() const { return documents_offset() + 8 * num_documents; }
};

// A validated .idx held in memory that this object does not own.
class IdxView {
 public:
  uint8_t dtype_code() const { return dtype_; }
  size_t token_size() const { return IdxDTypeSize(dtype_); }
  uint64_t num_sequences() const { return layout_.num_sequences; }
  uint64_t num_documents() const { return layout_.num_documents; }
  // REQUIRES: i < num_sequences() (j < num_documents()).
  int32_t length(uint64_t i) const;  // tokens
  int64_t offset(uint64_t i) const;  // byte offset into .bin
  uint64_t nbytes(uint64_t i) const { return static_cast<uint64_t>(length(i)) * token_size(); }
  int64_t document(uint64_t j) const;

 private:
  friend Result<IdxView> ParseIdx(std::string_view, std::span<const uint8_t>, uint64_t);
  const uint8_t* data_ = nullptr;
  uint8_t dtype_ = 0;
  IdxLayout layout_;
};

// Parses and validates an .idx image against the size of its .bin; never reads
// outside `bytes`, whatever they hold (fuzzed). `label` (the .idx path) starts
// every message.
// \error Corruption when the image is shorter than the header ("truncated"), the
//        magic or version is wrong, the dtype code is unknown, N or D make the
//        arrays overflow or run past the end ("count mismatch": the file size is
//        not 34 + 12N + 8D), a sequence length is negative, a sequence's bytes leave
//        the .bin ("sequence i: offset ... past the end of ..."), or the document
//        index decreases or points past N. Messages name the field and sequence.
Result<IdxView> ParseIdx(std::string_view label, std::span<const uint8_t> bytes, uint64_t bin_size);

// The bytes of a whole file: mapped read-only when the Env gives a descriptor
// (a real file), else read into memory (NewMemEnv).
class FileImage {
 public:
  ~FileImage();
  FileImage(const FileImage&) = delete;
  FileImage& operator=(const FileImage&) = delete;
  // \error NotFound / IOError from the Env or mmap.
  static Result<std::unique_ptr<FileImage>> Open(Env* env, const std::string& path);
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  FileImage() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string copy_;  // when not mapped
};

// An .idx file's image, validated against `bin_size`.
class IdxFile {
 public:
  // \error NotFound / IOError from the Env; Corruption as ParseIdx.
  static Result<std::unique_ptr<IdxFile>> Open(Env* env, const std::string& path, uint64_t bin_size);

  const IdxView& view() const { return view_; }
  std::span<const uint8_t> bytes() const { return image_->bytes(); }

 private:
  IdxFile() = default;
  std::unique_ptr<FileImage> image_;
  IdxView view_;
};

// What an .idx holds, produced on demand (a rank's view, a writer's buffer).
class IdxSource {
 public:
  virtual ~IdxSource() = default;
  virtual IdxLayout layout() const = 0;
  virtual uint8_t dtype_code() const = 0;
  // Fill out[0, count) with lengths / .bin offsets / document entries from `first`.
  virtual Status Lengths(uint64_t first, uint64_t count, int32_t* out) const = 0;
  virtual Status Offsets(uint64_t first, uint64_t count, int64_t* out) const = 0;
  virtual Status Documents(uint64_t first, uint64_t count, int64_t* out) const = 0;
};

// Writes bytes [offset, offset + n) of the .idx that `src` describes into dst.
// REQUIRES: offset + n <= src.layout().total_size().
// \error whatever the source's fills return.
Status RenderIdx(const IdxSource& src, uint64_t offset, size_t n, char* dst);

// The 34-byte header.
std::string EncodeIdxHeader(uint8_t dtype_code, uint64_t num_sequences, uint64_t num_documents);

// Writes PREFIX.bin and PREFIX.idx of exactly `num_sequences` sequences, one
// document each, streaming: memory stays bounded whatever N is.
class MegatronWriter {
 public:
  ~MegatronWriter();
  // \error InvalidArgument for an unknown dtype code; IOError from the Env.
  static Result<std::unique_ptr<MegatronWriter>> Create(Env* env, const std::string& prefix, uint8_t dtype_code,
                                                        uint64_t num_sequences);
  // Appends one sequence: `tokens` holds length * dtype size bytes.
  // \error InvalidArgument when more than num_sequences are added or the byte count
  //        is not a whole number of tokens; IOError from the Env.
  Status Add(std::string_view tokens);
  // Writes the rest of the index and closes both files.
  // \error FailedPrecondition when fewer sequences were added; IOError.
  Status Finish();

 private:
  MegatronWriter() = default;
  Status FlushArrays();
  std::string prefix_;
  uint8_t dtype_ = 0;
  IdxLayout layout_;
  std::unique_ptr<WritableFile> bin_, idx_;
  uint64_t added_ = 0, flushed_ = 0, bin_bytes_ = 0;
  std::vector<int32_t> lengths_;  // sequences [flushed_, added_)
  std::vector<int64_t> offsets_;
  std::string bin_buf_;  // .bin bytes not yet appended
  bool finished_ = false;
};

}  // namespace ptc
