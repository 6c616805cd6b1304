// Rank files of a compaction (ptc/store/rank_files.h): which of a layout's
// safetensors files a compaction writes whole, so that they exist byte for
// byte on disk and the mount can let the kernel read them (FUSE passthrough,
// fs/passthrough.h). docs/store_format.md, "Rank files".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ptc/model/config.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/schema.h"
#include "ptc/model/view.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/store.h"
#include "transform/execute.h"

namespace ptcfs {

// The metadata of rank `rank`'s safetensors files in `config`.
std::map<std::string, std::string> SafetensorsMetadata(const ptc::ParallelConfig& config, int rank);

// Pure. For every rank of the layout (in rank order), its model.safetensors and
// optim.safetensors (in that order) as a rank file in its worker's directory,
// when each of its tensors stores its shards contiguously and in order in the
// file (every built-in layout) and no earlier file took one of them: a shard
// is stored once per worker, so of ranks holding the same shard (data-parallel
// replicas, tied embeddings) only the first gets a rank file; the others are
// served by the daemon from it. Zero-byte shards are not placed.
// \error as ModelLayout::View and EncodeSafetensorsHeader.
ptc::Result<std::vector<ptc::RankFileSpec>> PlanRankFiles(const ptc::ModelLayout& layout);

// Whether `generation` stores every shard `files` place in its rank file.
bool RankFilesWritten(const std::vector<ptc::RankFileSpec>& files, const ptc::GenerationManifest& generation);

// A compaction that writes rank files: ptc::transform::PlanCompaction's, but when the
// generation's rank files are not written yet, every shard of the config is
// rewritten (into its rank file, or an HDF5 file when none takes it), also
// those stored as they are.
struct RankFileCompaction {
  ptc::transform::Compaction compaction;
  std::vector<ptc::RankFileSpec> files;
};
// \error as PlanCompaction, MakePlan and PlanRankFiles.
ptc::Result<RankFileCompaction> PlanRankFileCompaction(const ptc::Store& store);

}  // namespace ptcfs
