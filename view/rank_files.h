// Rank files of a compaction (ptc/store/rank_files.h): which of a layout's
// files a compaction writes whole (its safetensors files, its Megatron tree's
// model_optim_rng.pt files, or the chunk files of its DCP checkpoint), so
// that they exist byte for byte on disk and the mount can let the kernel read
// them (FUSE passthrough, fs/passthrough.h). docs/store_format.md, "Rank files".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/names.h"
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

// Which files are rank files: the mount's model/ safetensors files, its
// megatron/ tree's (--format megatron), or the __W_0.distcp files of its
// DCP checkpoint (dcp/, or megatron/'s torch_dist tree).
enum class RankFileFormat { kSafetensors, kMegatron, kDcp };

// How many bytes of copies (pieces another file of the same worker stores) a
// worker's rank files may hold, and in which format they are.
struct RankFileOptions {
  static constexpr uint64_t kWorkerStored = UINT64_MAX - 1;  // as many as the worker's stored pieces
  static constexpr uint64_t kAll = UINT64_MAX;
  uint64_t copy_budget = kWorkerStored;
  RankFileFormat format = RankFileFormat::kSafetensors;
  ptc::megatron::NameSet names = ptc::megatron::NameSet::kTe;  // kMegatron: the tree's name set
  ptc::dcp::Keys dcp_keys = ptc::dcp::Keys::kTorch;            // kDcp: the checkpoint's keys
};

// Whether a compaction into these rank files stores one piece per box
// (ptc::transform::PlanCompaction's box_targets): a DCP chunk is one box, and
// its storage one stored piece only when that piece is the box alone.
inline bool BoxTargets(const RankFileOptions& options) { return options.format == RankFileFormat::kDcp; }

// What Megatron rank files take besides the layout: the generation's Megatron
// state and the CRC-32 of each storage of each file (by rank), which their
// zip headers hold. A rank without CRCs here gets no rank file.
struct MegatronInputs {
  ptc::megatron::MegatronState state;
  std::map<int, std::vector<uint32_t>> crcs;
};
// Reads them from `generation` of `store` (in `layout`, its model and config):
// every tensor of the tree's files once (with `worker` >= 0, of that worker's
// files only: a cluster worker writes its own), each shard checked against
// its checksums.
// \error as LoadMegatronState, PlanMegatronFile and StorageCrcs (naming the rank).
ptc::Result<MegatronInputs> ReadMegatronInputs(const ptc::Store& store,
                                               std::shared_ptr<const ptc::GenerationManifest> generation,
                                               const ptc::ModelLayout& layout, ptc::megatron::NameSet names,
                                               int worker = -1);

// Parses --rank-file-copies: "all", "none" (0), "stored" (the default) or a
// byte count with an optional K/M/G/T suffix (powers of 1024).
// \error InvalidArgument "'TEXT': expected ..." (the caller names the option).
ptc::Result<uint64_t> ParseCopyBudget(const std::string& text);

// Pure. For every rank of the layout (in rank order), its model.safetensors and
// optim.safetensors (in that order) as a rank file in its worker's directory
// (with RankFileFormat::kMegatron: the model_optim_rng.pt of each rank the
// megatron/ tree shows, from `megatron`),
// when each of its tensors stores its shards contiguously and in order in the
// file (every built-in layout). A shard is stored once per worker, in the
// first file that holds it (a placement); a later file of the same worker that
// holds it too (tensor-parallel replicated norms and biases, tied embeddings,
// data-parallel replicas) gets a copy of its bytes at its own offset, so that
// every file exists whole. Copies cost disk: a worker's files get them up to
// `options.copy_budget` bytes, the files with the fewest copy bytes first
// (ties in rank order); a file left out keeps its placements only (served by
// the daemon). Zero-byte shards are not placed.
// \error as ModelLayout::View and EncodeSafetensorsHeader, or PlanMegatronFile
//        and LayMegatronFile; InvalidArgument for kMegatron without `megatron`.
ptc::Result<std::vector<ptc::RankFileSpec>> PlanRankFiles(const ptc::ModelLayout& layout,
                                                          const RankFileOptions& options = {},
                                                          const MegatronInputs* megatron = nullptr);

// Pure. The DCP chunk files of generation `m` (PlanCheckpoint with `keys`)
// as rank files "dcp.__W_0.distcp" (torch_dist.__W_0.distcp for Megatron-Core's
// keys, dcp-torchtitan.__W_0.distcp for torchtitan's), one per worker whose file is its stored
// pieces with zip records around them: every chunk's storage the whole of one
// piece of one box on the file's worker. A file with a chunk that is not (a
// piece of several boxes, part of a piece, torchtitan's woven heads) is left
// out: the daemon serves it. Every piece is in at most one file: no copies.
// \error as PlanCheckpoint and LayDcpChunk.
ptc::Result<std::vector<ptc::RankFileSpec>> PlanDcpRankFiles(const ptc::GenerationManifest& m, ptc::dcp::Keys keys);

// Parses --rank-file-format: "safetensors", "megatron" or "dcp".
// \error InvalidArgument "'TEXT': expected safetensors, megatron or dcp".
ptc::Result<RankFileFormat> ParseRankFileFormat(const std::string& text);

// Whether `generation` stores every shard `files` place in its rank file and
// lists every copy they hold.
bool RankFilesWritten(const std::vector<ptc::RankFileSpec>& files, const ptc::GenerationManifest& generation);

// A compaction that writes rank files: `planned` (ptc::transform::PlanCompaction's
// of the store, in `layout`, its model and config; with box_targets as
// BoxTargets(options) says), but when the generation's rank files are not
// written yet, every shard of the config is rewritten (into its rank file, or
// an HDF5 file when none takes it), also those stored as they are. DCP rank
// files are those of the generation the compaction writes (PlanDcpRankFiles).
struct RankFileCompaction {
  ptc::transform::Compaction compaction;
  std::vector<ptc::RankFileSpec> files;
};
// \error as MakePlan and PlanRankFiles.
ptc::Result<RankFileCompaction> PlanRankFileCompaction(ptc::transform::Compaction planned,
                                                       const ptc::ModelLayout& layout,
                                                       const RankFileOptions& options = {},
                                                       const MegatronInputs* megatron = nullptr);

// PlanRankFileCompaction of `store`'s generation `planned.source`; for
// Megatron rank files it reads their inputs first (ReadMegatronInputs, of
// `worker`'s files only when it is >= 0).
ptc::Result<RankFileCompaction> PrepareRankFileCompaction(const ptc::Store& store, ptc::transform::Compaction planned,
                                                          const ptc::ModelLayout& layout,
                                                          const RankFileOptions& options, int worker = -1);

}  // namespace ptcfs
