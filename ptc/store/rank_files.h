// Rank files: files a compaction writes whole, each the exact bytes of one file
// the mount shows (a rank's safetensors file), with the generation's shards
// placed inside them (docs/store_format.md, "Rank files"). The store does not
// know the format: a plan gives each file's header bytes, size and where each
// shard goes; every byte neither header nor placed shard is zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptc/model/box.h"

namespace ptc {

struct RankFileSpec {
  int worker = 0;
  std::string name;    // file name in gen-N/worker-WW/, e.g. "rank-00003.model.safetensors"
  std::string header;  // bytes [0, header.size())
  uint64_t size = 0;   // of the whole file
  struct Placement {
    std::string tensor;
    std::vector<Box> boxes;  // the stored shard's boxes, in its order
    uint64_t offset = 0;     // of the shard's bytes in the file
  };
  std::vector<Placement> placements;  // disjoint, inside [header.size(), size)
};

}  // namespace ptc
