// Every export of a store's generation into a fresh directory, in one place:
// `ptcfs export`'s formats. Each reads the tensors from the stored pieces
// (checksums verified on first use) and writes them through the same
// renderers a mount serves (view/*_file.h), so an export and a mount's files
// are the same bytes.
//
// The output directory must not exist or be empty; on failure it is removed
// again (WriteFreshDirectory). Every file is created new in its directory
// (Env::OpenOutputDir): a symbolic link planted in the tree while it is
// written is refused, never followed.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/model/model_layout.h"
#include "ptc/store/store.h"

namespace ptcfs {

// Per-rank safetensors or npy files (ptc/checkpoint/checkpoint.h) of
// `layout`: the store's model (SpecFromManifest) in the config to export.
// \error InvalidArgument when out_dir exists and is not empty; as
//        CheckCheckpointWrite; as GenerationReader::Read (Corruption for a bad
//        shard); as WriteRankCheckpoint.
ptc::Status ExportCheckpoint(const ptc::Store& store, const ptc::ModelLayout& layout, const std::string& out_dir,
                             ptc::CheckpointFormat format, const ptc::ProgressFn& progress = {});
// The same in `config`, the store's model checked against it here.
// \error FailedPrecondition for a store without a generation; as SpecFromManifest and ModelLayout::Make.
ptc::Status ExportCheckpoint(const ptc::Store& store, const ptc::ParallelConfig& config, const std::string& out_dir,
                             ptc::CheckpointFormat format, const ptc::ProgressFn& progress = {});

// Megatron-LM's tree: OUT/latest_checkpointed_iteration.txt and
// OUT/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt for every (tp, pp), in name set `names`.
// `layout`: the generation's model in the config to export. Writes into out_dir as it is.
// \error as the store reads and the Env (naming the file).
ptc::Status ExportMegatron(ptc::Env* env, const ptc::Store& store,
                           std::shared_ptr<const ptc::GenerationManifest> generation, const ptc::ModelLayout& layout,
                           const std::string& out_dir, ptc::megatron::NameSet names = ptc::megatron::NameSet::kTe,
                           const ptc::ProgressFn& progress = {});

// PyTorch DCP: OUT/.metadata and OUT/__W_0.distcp of the generation (keys as
// `keys` says: Megatron-Core's are the DCP part of a torch_dist directory).
// Writes into out_dir as it is.
// \error as PlanCheckpoint, the store reads and the Env (naming the file).
ptc::Status ExportDcp(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                      const std::string& out_dir, const ptc::ProgressFn& progress = {},
                      ptc::dcp::Keys keys = ptc::dcp::Keys::kTorch);

// Hugging Face's save_pretrained layout: OUT/config.json, the shards and
// (with more than one) the index, of the generation. Writes into out_dir as it is.
// \error as PlanHf, the store reads and the Env (naming the file).
ptc::Status ExportHf(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                     const std::string& out_dir, uint64_t max_shard_bytes, const ptc::ProgressFn& progress = {});

// Runs `write` to fill `out_dir`, which must not exist or be empty; on failure
// removes what it wrote (an empty directory that existed stays).
// \error InvalidArgument when out_dir exists and is not empty; as `write`.
ptc::Status WriteFreshDirectory(ptc::Env* env, const std::string& out_dir, const std::function<ptc::Status()>& write);

}  // namespace ptcfs
