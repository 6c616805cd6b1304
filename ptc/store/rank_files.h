// Rank files: files a compaction writes whole, each the exact bytes of one file
// the mount shows (a rank's safetensors file), with the generation's shards
// placed inside them (docs/store_format.md, "Rank files"). The store does not
// know the format: a plan gives each file's literal bytes (a safetensors
// header; a torch zip's headers and pickle), size and where each shard goes;
// every byte neither literal nor placed shard is zero.
//
// A file may also hold copies of pieces stored elsewhere on its worker (in
// another rank file, or earlier in itself): GenerationWriter writes a copy's
// bytes as it writes the piece, and the manifest lists them
// (GenerationManifest::rank_file_copies), verified by the piece's checksums.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ptc/model/box.h"
#include "ptc/store/manifest.h"

namespace ptc {

struct RankFileSpec {
  int worker = 0;
  std::string name;    // file name in gen-N/worker-WW/, e.g. "rank-00003.model.safetensors"
  struct Literal {
    uint64_t offset = 0;
    std::string bytes;
  };
  std::vector<Literal> literals;  // ordered, disjoint, inside [0, size)
  uint64_t size = 0;              // of the whole file
  struct Placement {
    std::string tensor;
    std::vector<Box> boxes;  // the stored shard's boxes, in its order
    uint64_t offset = 0;     // of the shard's bytes in the file
  };
  std::vector<Placement> placements;  // disjoint, inside [0, size), apart from the literals
  // Pieces of the worker that another placement (of this file or another)
  // stores: their bytes again, at `offset`. Disjoint from the placements.
  std::vector<Placement> copies;
};

// Each copy of `m` as the record of its bytes: its piece's record (checksums
// included) at the copy's file and offset, without `h5`, so that
// VerifyShard checks the copy. Manifest order; a copy of a zero-byte piece is
// left out.
// REQUIRES: `m` decoded (every copy names a stored piece).
std::vector<ShardRecord> CopyRecords(const GenerationManifest& m);

// Where a piece's bytes lie besides its own record: (file, offset) of each copy.
struct CopyPlace {
  std::string file;
  uint64_t offset = 0;
};
// The copies of `m` by the record (in `m`) of their piece; `m` must outlive it.
// REQUIRES: as CopyRecords.
std::map<const ShardRecord*, std::vector<CopyPlace>> CopiesByPiece(const GenerationManifest& m);

}  // namespace ptc
