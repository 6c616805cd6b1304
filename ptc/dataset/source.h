// A dataset's samples, by id, as the bytes a rank's view serves: the tokens of
// a Megatron sequence (samples.bin) or a JSONL line plus "\n" (samples.jsonl).
//
// Thread safety: after Open, every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/dataset/idx.h"
#include "ptc/dataset/jsonl.h"

namespace ptc {

enum class DatasetFormat { kMegatron, kJsonl };

std::string_view DatasetFormatName(DatasetFormat f);  // "megatron" | "jsonl"
// \error InvalidArgument naming the text.
Result<DatasetFormat> ParseDatasetFormat(std::string_view name);

class DatasetSource {
 public:
  virtual ~DatasetSource() = default;
  virtual DatasetFormat format() const = 0;
  virtual uint64_t num_samples() const = 0;
  // Bytes of sample `id` as served. REQUIRES: id < num_samples().
  virtual uint64_t SampleBytes(uint64_t id) const = 0;
  // Its length for length groups: tokens (Megatron) or bytes without "\n" (JSONL).
  virtual uint64_t SampleLength(uint64_t id) const = 0;
  // Reads bytes [offset, offset + n) of sample `id` as served.
  // REQUIRES: offset + n <= SampleBytes(id).
  // \error Corruption / IOError from the Env (the source changed under us).
  virtual Status ReadSample(uint64_t id, uint64_t offset, size_t n, char* dst) const = 0;
  // Megatron: the token dtype code of the .idx; JSONL: 0.
  virtual uint8_t dtype_code() const = 0;
  // The fingerprint checksum: xxh64 of PREFIX.idx / of the JSONL index's pairs.
  // O(index size).
  virtual uint64_t IndexChecksum() const = 0;
};

// Opens PREFIX.idx (mapped and validated) and PREFIX.bin.
// \error NotFound when either file is missing; Corruption as ParseIdx.
Result<std::unique_ptr<DatasetSource>> OpenMegatronSource(Env* env, const std::string& prefix);

// Opens `jsonl_path` with the index at `index_path` (dataset_jsonl.h).
// \error NotFound / Corruption as JsonlIndex::Open.
Result<std::unique_ptr<DatasetSource>> OpenJsonlSource(Env* env, const std::string& jsonl_path,
                                                       const std::string& index_path);

}  // namespace ptc
