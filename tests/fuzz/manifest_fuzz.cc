// libFuzzer entry point for the store's manifests: the generation manifest
// and the root manifest. Neither decoder may crash; an accepted generation
// manifest encodes to text that decodes to the same manifest, and each of its
// copies in rank files (rank_file_copies) names a stored piece of its worker.
// Run: ./manifest_fuzz -max_total_time=60 -max_len=8192 tests/fuzz/corpus/manifest_fuzz
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ptc/store/manifest.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/store_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)ptc::DecodeRootManifest("fuzz", input);
  if (auto m = ptc::DecodeManifest("fuzz", input); m.ok()) {
    auto again = ptc::DecodeManifest("fuzz", ptc::EncodeManifest(*m));
    if (!again.ok() || !(*again == *m)) __builtin_trap();
    size_t copies = 0;
    for (const ptc::RankFileCopies& f : m->rank_file_copies) copies += f.copies.size();
    const auto records = ptc::CopyRecords(*m);  // a copy of a zero-byte piece is left out
    if (records.size() > copies) __builtin_trap();
    size_t placed = 0;
    for (const auto& [piece, places] : ptc::CopiesByPiece(*m)) placed += places.size();
    if (placed != records.size()) __builtin_trap();
  }
  return 0;
}
