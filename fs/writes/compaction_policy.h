// When a mount compacts its generation in the background, and into what
// (docs/mount_format.md, "Compaction").
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>

#include "transform/covering.h"
#include "view/rank_files.h"

namespace ptcfs {

// When the mount compacts in the background (after a reconfigure commits a
// covering, docs/mount_format.md): when the generation's shards are read from
// more than `max_pieces_per_shard` pieces on average, or from a piece smaller
// than `min_piece_bytes`. The compaction runs at the lowest CPU priority,
// serves on meanwhile, and gives way to a reconfigure or a save (cancelled,
// nothing committed).
struct CompactionPolicy {
  double max_pieces_per_shard = 8;  // 0: never on this rule
  uint64_t min_piece_bytes = 0;     // 0: never on this rule
  // Write the files the job reads (the layout's safetensors files, megatron/'s
  // or dcp/'s) whole as rank files (view/rank_files.h), which the kernel can
  // then read itself (--passthrough auto).
  bool rank_files = false;
  RankFileOptions rank_file_options;  // their format, and which copies they hold (--rank-file-copies)
  // Whether a compaction stores a piece per box (DCP rank files: BoxTargets).
  bool box_targets() const { return rank_files && BoxTargets(rank_file_options); }
  bool Due(const ptc::transform::Fragmentation& f) const {
    return (max_pieces_per_shard > 0 && f.pieces_per_shard() > max_pieces_per_shard) ||
           (min_piece_bytes > 0 && f.pieces > 0 && f.smallest_piece < min_piece_bytes);
  }
};

}  // namespace ptcfs
