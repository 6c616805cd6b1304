// `ptcfs import --format megatron`: a Megatron-LM checkpoint tree
// (ptc/checkpoint/megatron/megatron.h) as a checkpoint source for ImportFrom.
//
// The iteration comes from --iteration or latest_checkpointed_iteration.txt;
// tp, pp and ep from the first rank's args (tensor_model_parallel_size,
// pipeline_model_parallel_size, expert_model_parallel_size), else from the
// iteration's mp_rank_TT[_PPP][_EEE] directories (read in tp, pp, dp = ep,
// ep: each expert-data-parallel rank 0 saved one file, every rank of its
// (tp, pp, ep) loads it); every directory of that grid must be there. Each
// file's rng_state is kept per (tp, pp, ep) (the expert-parallel tracker
// differs per ep rank); extra entries of every file (an expert's under its
// global expert id). Each rank file is read with the
// restricted unpickler, every member's CRC-32 is checked, and every tensor of
// the rank's view must be found with the schema's dtype and shape, in either
// of Megatron-Core's name sets (megatron/names.h, recognised per file; with
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

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/model/schema.h"

namespace ptc {

struct MegatronImportOptions {
  std::string dir;  // holds latest_checkpointed_iteration.txt and iter_NNNNNNN/
  Schema schema;
  ModelDims dims;
  std::optional<uint64_t> iteration;     // default: latest_checkpointed_iteration.txt
  // default: tp, pp (and ep) of the args, else of the directories, dp=ep; given: must agree with the args, and
  // gives the grid of a tree without them
  std::optional<ParallelConfig> config;
};

// \error NotFound naming the missing latest file, iteration directory, rank
//        directory (of the grid the args give) or rank file; InvalidArgument
//        for a latest file that is not a number, a rank directory outside the
//        grid, args sizes that are not ints, a config that disagrees with the
//        grid, a rank without the rng_state the first has; as ReadTorchFile
//        for the first rank's file and every rank's (their rng_state).
//        The source's open_rank fails as ReadTorchFile and
//        megatron::FindRankTensors; its files' CRCs are source.crcs', which
//        the import checks (Corruption naming the member) before it commits.
Result<CheckpointSource> OpenMegatronCheckpoint(Env* env, const MegatronImportOptions& options);

// What one rank file (tp, pp) of a save holds besides the schema's tensors:
// its rng_state (kept.rng, none or one record), its `*._extra_state`
// entries, each parameter's optimizer `step` (one record per parameter), the
// settings of its expert-parallel optimizer's groups that hold experts; for
// rank (0, 0) also its other entries (args, ...: kept.carried and
// kept.tensors) and the (dense) optimizer's group settings. The source's extra is
// these folded (FoldRanks) over every rank of the grid.
struct KeptRank {
  int tp = 0, pp = 0;
  std::string file;  // for messages
  megatron::MegatronState kept;
  int ep = 0;  // the expert-parallel rank (mp_rank_..._EEE)
};

// The state a save's ranks make together (extra["megatron"]): rank (0, 0)'s
// entries, every (tp, pp, ep) rank's rng_state when the first rank has one, the extra
// entries (one per tp rank and global name, from the lowest pp rank), every
// parameter's step once, each expert-parallel group's settings from the first
// rank whose experts are in it. The same whichever worker held which rank.
// \error InvalidArgument naming the file: a rank outside the tp x pp grid or
//        given twice, ranks missing, a rank without the rng_state the first
//        has, a parameter whose step differs between two ranks.
Result<megatron::MegatronState> FoldRanks(uint64_t iteration, int tp, int pp, std::vector<KeptRank> ranks, int ep = 1);

// The rank files of one save that one worker holds (a save on many workers,
// docs/cluster.md): none, some or all of the grid.
struct MegatronSavePart {
  // spec (as the first of these files shows it), config (tp and pp of the
  // save's grid, from that file's args), open_rank over these files.
  CheckpointSource source;
  std::vector<KeptRank> kept;  // one per rank file here, in (pp, tp) order
};

// The rank files of options.iteration (required) under options.dir: a part
// without ranks when there are none. The grid is the first file's args'
// (tensor_model_parallel_size, pipeline_model_parallel_size), else
// options.config's tp and pp (the layout the job runs).
// \error InvalidArgument when neither gives the grid or a rank directory lies
//        outside it; as OpenMegatronCheckpoint for each file.
Result<MegatronSavePart> OpenMegatronSavePart(Env* env, const MegatronImportOptions& options);

// A kept rank as JSON (a part of a save sent to the other workers), and back.
// \error InvalidArgument naming `what` and the field at fault.
nlohmann::json EncodeKeptRank(const KeptRank& rank);
Result<KeptRank> DecodeKeptRank(const nlohmann::json& j, const std::string& what);

}  // namespace ptc
