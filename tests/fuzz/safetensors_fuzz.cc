// libFuzzer entry point for the format parsers: ParseSafetensorsHeader and
// ParseNpyHeader must never crash, and what they accept must be consistent.
// Build: cmake -DPTCFS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tests/fuzz/CMakeLists.txt);
// run:   ./safetensors_fuzz -max_total_time=60 -max_len=4096 [corpus dir]
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ptc/format/npy.h"
#include "ptc/format/safetensors.h"

namespace {

// An accepted header's tensors, encoded again (in data order), parse back to
// the same tensors: the encoder writes what the parser reads.
void CheckEncode(const ptc::SafetensorsHeader& h) {
  std::vector<ptc::TensorSpec> specs;
  uint64_t data = 0;
  for (const ptc::SafetensorsEntry& e : h.tensors) {
    specs.push_back({e.name, e.dtype, e.shape});
    data += e.nbytes;
  }
  auto bytes = ptc::EncodeSafetensorsHeader(specs, h.metadata);
  if (!bytes.ok()) return;  // a name or metadata text that is not UTF-8
  auto again = ptc::ParseSafetensorsHeader("again", *bytes, bytes->size() + data);
  if (!again.ok() || again->tensors.size() != h.tensors.size() || again->metadata != h.metadata) __builtin_trap();
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const ptc::SafetensorsEntry &a = h.tensors[i], &b = again->tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.nbytes != b.nbytes) __builtin_trap();
  }
}

// Accepted safetensors headers tile [data_start, file_size) exactly.
void CheckTiling(const ptc::SafetensorsHeader& h, uint64_t file_size) {
  uint64_t at = h.data_start;
  for (const ptc::SafetensorsEntry& e : h.tensors) {
    if (e.offset != at || e.nbytes != static_cast<uint64_t>(ptc::NumElements(e.shape)) * ptc::DTypeSize(e.dtype))
      __builtin_trap();
    at += e.nbytes;
  }
  if (at != file_size || h.file_size != file_size) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto st = ptc::ParseSafetensorsHeader("fuzz", input, size);
  if (st.ok()) {
    CheckTiling(*st, size);
    CheckEncode(*st);
  }
  // The same bytes as the prefix of a longer file (data not read yet).
  auto longer = ptc::ParseSafetensorsHeader("fuzz", input, size + 64);
  if (longer.ok()) CheckTiling(*longer, size + 64);
  auto npy = ptc::ParseNpyHeader("fuzz", input);
  if (npy.ok() && (npy->data_offset > size ||
                   npy->nbytes != static_cast<uint64_t>(ptc::NumElements(npy->shape)) * ptc::DTypeSize(npy->dtype)))
    __builtin_trap();
  return 0;
}
