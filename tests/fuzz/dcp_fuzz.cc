// libFuzzer entry point for PyTorch DCP's .metadata (ptc::dcp::ParseMetadata):
// it must never crash, and what it accepts must be consistent (every chunk
// lies inside its tensor and names a plain file of the directory; the chunk
// check agrees with comparing every pair; a key's ChainedOptimizer prefix
// splits off whole).
// Build: cmake -DPTCFS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tests/fuzz/CMakeLists.txt);
// run:   ./dcp_fuzz -max_total_time=60 -max_len=65536 [corpus dir]
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/read.h"

namespace {

// The check CheckChunksDisjoint replaced: every chunk against every earlier one.
bool PairwiseDisjoint(const ptc::dcp::SavedTensor& t) {
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (ptc::Intersect(t.chunks[i].box, t.chunks[j].box) && t.chunks[i].box.volume() > 0 &&
          t.chunks[j].box.volume() > 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto saved = ptc::dcp::ParseMetadata(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!saved.ok()) return 0;
  for (const ptc::dcp::SavedTensor& t : saved->tensors) {
    // A key's ChainedOptimizer prefix (torch_dist saves at ep > 1) is chained_0. or chained_1., the rest the key.
    const auto [rest, chain] = ptc::dcp::WithoutChainedPrefix(t.key);
    if (chain < 0 ? rest != t.key
                  : (chain > 1 || t.key != "chained_" + std::to_string(chain) + "." + std::string(rest))) {
      __builtin_trap();
    }
    // The sweep agrees with comparing every pair (small inputs: the pairs are few).
    if (t.chunks.size() <= 2000 && ptc::dcp::CheckChunksDisjoint(t, "fuzz").ok() != PairwiseDisjoint(t)) {
      __builtin_trap();
    }
    for (const ptc::dcp::SavedChunk& c : t.chunks) {
      if (c.box.rank() != t.shape.size()) __builtin_trap();
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (c.box.begin[d] < 0 || c.box.begin[d] > c.box.end[d] || c.box.end[d] > t.shape[d]) __builtin_trap();
      }
      if (c.file.empty() || c.file.find('/') != std::string::npos || c.file == "." || c.file == "..") {
        __builtin_trap();
      }
    }
  }
  return 0;
}
