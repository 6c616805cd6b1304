// Megatron-LM torch files rendered from the store (layout: ptc/checkpoint/megatron/megatron.h):
// the mount's megatron/ tree and `ptcfs export --format megatron`.
//
// A rank's model_optim_rng.pt is a stored zip (ptc/format/torch_file.h) whose storage
// members are the rank's local tensors. Its size and every offset follow from
// the view alone, so `stat` is exact at once. The zip headers also hold each
// member's CRC-32: StorageCrcs composes a storage's from the block CRC-32s
// its pieces recorded when they were written (ShardRecord::block_crc32s,
// Crc32Combine), reading only the bytes of a block a storage covers in part
// (a row slice of a piece after a tensor-parallel change, not aligned to a
// block) and those it cannot compose (a column slice: a strided run; a
// piece of an older manifest without them). The file is then served like a
// safetensors file, literal pieces plus shard extents. The mount keeps the
// CRCs per snapshot and rank, so only the first open of a file computes them.
//
// Thread safety: pure functions, and reads of the store.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/format/torch_file.h"
#include "ptc/store/store.h"
#include "view/virtual_file.h"

namespace ptcfs {

// What one rank's file holds, and its zip members (CRCs of storages unset).
struct MegatronFilePlan {
  ptc::megatron::RankState state;
  ptc::TorchFilePlan torch;
  uint64_t size = 0;  // of the whole file
};

inline constexpr const char* kMegatronArchive = "model_optim_rng";

// `names`: Megatron-Core's name set the file uses (ptc/checkpoint/megatron/names.h).
// \error as BuildRankState and PlanTorchFile.
ptc::Result<MegatronFilePlan> PlanMegatronFile(const ptc::ModelSpec& spec, const ptc::ParallelConfig& config,
                                               const ptc::RankView& view, const ptc::megatron::MegatronState& state,
                                               ptc::megatron::NameSet names);

// The CRC-32 of each storage of `plan`, composed from the pieces' block
// CRC-32s where they cover it, else reading the tensors from the store (every
// shard range read passes `check` first; nothing else is read).
// \error as `check`, GenerationReader::Cover / File and the reads.
ptc::Result<std::vector<uint32_t>> StorageCrcs(const ptc::GenerationReader& reader, const MegatronFilePlan& plan,
                                               int prefer_worker, const ShardCheck& check);

// Where the file lays its bytes, given its storages' CRCs: in file order,
// literal ranges (zip headers, data.pkl, carried storages; adjacent ones
// joined) and the data of each tensor storage. What MakeMegatronFile serves
// and a Megatron rank file (view/rank_files.h) holds.
struct MegatronFilePart {
  uint64_t offset = 0;
  std::string literal;                       // when `tensor` is null
  const ptc::LocalTensor* tensor = nullptr;  // the plan's: its bytes from `offset` on
};
struct MegatronFileBytes {
  std::vector<MegatronFilePart> parts;
  uint64_t size = 0;
};
// \error InternalError when `crcs` are not one per storage; as LayoutTorchFile.
ptc::Result<MegatronFileBytes> LayMegatronFile(const MegatronFilePlan& plan, const std::vector<uint32_t>& crcs);

// The file, given its storages' CRCs.
// \error as LayMegatronFile.
ptc::Result<std::unique_ptr<VirtualFile>> MakeMegatronFile(const ptc::GenerationReader& reader,
                                                           const MegatronFilePlan& plan,
                                                           const std::vector<uint32_t>& crcs, int prefer_worker);

// The ranks a Megatron tree shows among `views`: one per (tp, pp, ep), the
// one with the lowest expert-data-parallel index (Megatron's expert-data-
// parallel rank 0 saves; every rank of the same (tp, pp, ep) loads it; for a
// dense model the data-parallel rank 0). Indices into `views`, in rank order.
std::vector<size_t> MegatronRanks(const std::vector<ptc::RankView>& views);

// The rank directory of `view` in `config`: mp_rank_TT[_PPP][_EEE].
std::string MegatronRankDir(const ptc::RankView& view, const ptc::ParallelConfig& config);

// The views of the ranks a Megatron tree of `layout` shows (MegatronRanks), in rank order.
// \error as CheckLegacySave and ModelLayout::View.
ptc::Result<std::vector<ptc::RankView>> MegatronTreeViews(const ptc::ModelLayout& layout);

// Writes `plan`'s file (model_optim_rng.pt) into `dir`, reading every
// tensor through `reader` (which verifies each shard it opens).
// \error as the store reads and the Env (naming the file).
ptc::Status WriteMegatronFile(const ptc::GenerationReader& reader, const MegatronFilePlan& plan, ptc::OutputDir& dir,
                              const ptc::ProgressFn& progress = {});

}  // namespace ptcfs
