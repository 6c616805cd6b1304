// Bytes [offset, offset + length) of another file, read as a file of their own
// (a chunk of a DCP file, an entry of an archive).
//
// Thread safety: as the base file's reads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "ptc/base/env.h"

namespace ptc {

class FileRange final : public RandomAccessFile {
 public:
  // `base` must outlive this.
  FileRange(const RandomAccessFile& base, uint64_t offset, uint64_t length, std::string path)
      : base_(base), offset_(offset), length_(length), path_(std::move(path)) {}
  Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset > length_ || n > length_ - offset) return CorruptionError(path_ + ": read past the range's end");
    return base_.Read(offset_ + offset, n, dst);
  }
  uint64_t Size() const override { return length_; }
  const std::string& path() const override { return path_; }

 private:
  const RandomAccessFile& base_;
  const uint64_t offset_, length_;
  const std::string path_;
};

}  // namespace ptc
