// The NumPy .npy format: header encoding and parsing, and a streaming writer.
//
// A file is the magic "\x93NUMPY", a version (1.0: u16 little-endian header
// length; 2.0 and 3.0: u32), then an ASCII Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n' so that the data, which follows in C
// order, starts at a multiple of 64. We write 1.0, or 2.0 when the dict does
// not fit a u16.
//
// NumPy has no bf16 or fp8: BF16 is written as '<V2' and F8_E4M3 / F8_E5M2 as
// '|V1', bytes kept exact. The true dtype of every tensor of a directory is
// recorded in its sidecar kNpyDTypesFile, a JSON object file name -> dtype name
// (EncodeNpyDTypes / ParseNpyDTypes). Format notes: docs/safetensors_and_npy.md.
//
// Every error message begins with the label (the file path). Malformed
// content is InvalidArgument.
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

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"

namespace ptc {

// The sidecar that names the true dtype of each .npy file in a directory.
inline constexpr std::string_view kNpyDTypesFile = "dtypes.json";

// NumPy's spelling of `dtype`: "<f4", "|b1", "<V2" (BF16), "|V1" (fp8).
std::string_view NpyDescr(DType dtype);

// The header bytes (magic to '\n', a multiple of 64) of a C-order array.
// REQUIRES: every dimension >= 0.
std::string EncodeNpyHeader(DType dtype, const Shape& shape);

struct NpyHeader {
  // For the raw descrs "V2" and "V1", BF16 and F8_E4M3, and `raw` is set: the
  // bytes are exact but the true dtype is the one kNpyDTypesFile records.
  DType dtype;
  bool raw = false;
  Shape shape;
  uint64_t data_offset = 0;  // from the start of the file
  uint64_t nbytes = 0;       // of the data
};

// Parses the header at the start of `prefix` (the first bytes of a file; the
// data need not be there). Pure and safe on any input (the fuzz target calls it).
// \error InvalidArgument when the magic or version is wrong; `prefix` ends
//        before the header does; the dict is malformed, lacks or repeats a key
//        or has another; the descr is not one of NpyDescr's (big-endian,
//        structured and string types included); fortran_order is True (not
//        supported); a dimension is negative or the byte size overflows.
Result<NpyHeader> ParseNpyHeader(std::string_view label, std::string_view prefix);

// The kNpyDTypesFile content for `files` (file name -> dtype): a JSON object.
// \error InvalidArgument when a file name is not valid UTF-8.
Result<std::string> EncodeNpyDTypes(const std::map<std::string, DType>& files);
// \error InvalidArgument (naming `label`) when `text` is not a JSON object of dtype names.
Result<std::map<std::string, DType>> ParseNpyDTypes(std::string_view label, std::string_view text);

// Writes one .npy file as a stream: Create writes the header, Append the data
// in C order (any chunking), Finish checks the size, syncs and closes. The file
// is written in place; a writer dropped before Finish leaves a partial file.
// Recording the dtype in kNpyDTypesFile is the caller's job.
class NpyWriter {
 public:
  // \error InvalidArgument (naming `path`) for a negative dimension or a byte size that overflows.
  // \error as Env::OpenWrite.
  static Result<std::unique_ptr<NpyWriter>> Create(Env* env, const std::string& path, DType dtype, const Shape& shape);
  // The file `name` of an output tree (OutputDir::NewWritableFile: created
  // new in its directory, never through a link).
  // \error as above and OutputDir::NewWritableFile.
  static Result<std::unique_ptr<NpyWriter>> Create(OutputDir& dir, const std::string& name, DType dtype,
                                                   const Shape& shape);
  ~NpyWriter();

  // \error FailedPrecondition when `n` bytes go past the end of the data or after Finish.
  // \error as WritableFile::Append.
  Status Append(const void* data, size_t n);
  // \error FailedPrecondition when fewer bytes than the shape needs were appended.
  // \error as WritableFile::Sync and Close.
  Status Finish();

 private:
  NpyWriter(std::string path, std::unique_ptr<WritableFile> file, uint64_t nbytes);
  // Checks the shape, then opens the file at `path` with `open`.
  static Result<std::unique_ptr<NpyWriter>> Start(const std::string& path, DType dtype, const Shape& shape,
                                                  const std::function<Result<std::unique_ptr<WritableFile>>()>& open);

  std::string path_;
  std::unique_ptr<WritableFile> file_;
  uint64_t nbytes_;  // of the data
  uint64_t written_ = 0;
  bool finished_ = false;
};

}  // namespace ptc
