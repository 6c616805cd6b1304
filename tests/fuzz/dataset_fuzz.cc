// libFuzzer entry point for the dataset files: Megatron .idx images, the JSONL
// line index, JSONL sources and the dataset state record. None may crash or
// read outside its input; what a JSONL scan indexes must validate.
// Run: ./dataset_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/dataset_fuzz
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ptc/base/env.h"
#include "ptc/dataset/idx.h"
#include "ptc/dataset/jsonl.h"
#include "ptc/dataset/state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::span<const uint8_t> bytes(data, size);
  // The .bin / source size the image claims to describe: the input's first byte picks one.
  const uint64_t other_size = size == 0 ? 0 : static_cast<uint64_t>(data[0]) * 97;
  if (auto idx = ptc::ParseIdx("fuzz.idx", bytes, other_size); idx.ok()) {
    for (uint64_t i = 0; i < idx->num_sequences(); ++i) {
      if (idx->offset(i) < 0 || static_cast<uint64_t>(idx->offset(i)) + idx->nbytes(i) > other_size) __builtin_trap();
    }
  }
  if (auto index = ptc::ParseJsonlIndex("fuzz.jsonl.idx", bytes, other_size); index.ok()) {
    for (uint64_t i = 0; i < index->num_samples(); ++i) {
      if (index->start(i) > index->end(i) || index->end(i) > other_size) __builtin_trap();
    }
  }
  (void)ptc::DecodeDatasetStateText("fuzz", input);

  // The input as a JSONL source: its index must be one the parser accepts.
  static std::unique_ptr<ptc::Env> env = ptc::NewMemEnv();
  if (!ptc::WriteFileAtomic(env.get(), "/src.jsonl", input).ok()) __builtin_trap();
  auto scan = ptc::ScanJsonl(env.get(), "/src.jsonl", "/src.jsonl.idx");
  if (!scan.ok()) __builtin_trap();
  auto image = ptc::ReadFileToString(env.get(), "/src.jsonl.idx");
  if (!image.ok()) __builtin_trap();
  auto index = ptc::ParseJsonlIndex("src.jsonl.idx",
                                    std::span(reinterpret_cast<const uint8_t*>(image->data()), image->size()), size);
  if (!index.ok() || index->num_samples() != scan->num_samples) __builtin_trap();
  return 0;
}
