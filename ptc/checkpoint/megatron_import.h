// `ptcfs import --format megatron`: a Megatron-LM checkpoint tree
// (ptc/checkpoint/megatron.h) as a checkpoint source for ImportFrom.
//
// The iteration comes from --iteration or latest_checkpointed_iteration.txt;
// tp and pp from the first rank's args (tensor_model_parallel_size,
// pipeline_model_parallel_size), else from the iteration's mp_rank_TT[_PPP]
// directories (dp = 1: every data-parallel rank loads the same files); every
// directory of that grid must be there. Each rank file is read with the
// restricted unpickler, every member's CRC-32 is checked, and every tensor of
// the rank's view must be found with the schema's dtype and shape, in either
// of Megatron-Core's name sets (megatron_names.h, recognised per file; with
// optimizer state, in that set's parameter order). The
// non-tensor entries of the first rank's file (args, ...), each rank's
// rng_state and `*._extra_state` model entries, and the iteration are kept in
// the manifest (extra["megatron"]) and rendered again.
//
// Thread safety: the source's functions must be called from one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ptc/checkpoint/import.h"
#include "ptc/model/schema.h"

namespace ptc {

struct MegatronImportOptions {
  std::string dir;  // holds latest_checkpointed_iteration.txt and iter_NNNNNNN/
  Schema schema;
  ModelDims dims;
  std::optional<uint64_t> iteration;     // default: latest_checkpointed_iteration.txt
  std::optional<ParallelConfig> config;  // default: tp, pp of the directories, dp=1; given: must agree
};

// \error NotFound naming the missing latest file, iteration directory, rank
//        directory (of the grid the args give) or rank file; InvalidArgument
//        for a latest file that is not a number, a rank directory outside the
//        grid, args sizes that are not ints, a config that disagrees with the
//        grid, a rank without the rng_state the first has; as ReadTorchFile
//        for the first rank's file and every rank's (their rng_state).
//        The source's open_rank fails as ReadTorchFile, VerifyTorchFileCrcs
//        (Corruption naming the member) and megatron::FindRankTensors.
Result<CheckpointSource> OpenMegatronCheckpoint(Env* env, const MegatronImportOptions& options);

}  // namespace ptc
