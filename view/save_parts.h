// A Megatron save through megatron/ on many workers (docs/cluster.md, "Saves
// on many workers"): each worker writes the rank files staged on it into
// pieces of its own and tells the others what else those files hold
// (SavePartExtra); once every worker's part is in, each settles the same
// generation from all the parts (SettleSave).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/dataset/state.h"
#include "ptc/model/config.h"
#include "ptc/store/manifest.h"
#include "ptc/store/model_spec.h"

namespace ptcfs {

// The data position a save commits with its model: its
// args.consumed_train_samples (docs/dataset_format.md, "A save's position"),
// or `current` when there is no dataset or the args do not say. Also checks
// that the state dict's 'iteration' is `iteration`.
// \error InvalidArgument naming the field at fault.
ptc::Result<std::optional<ptc::DatasetState>> SavedDataPosition(const ptc::megatron::MegatronState& saved,
                                                                uint64_t iteration,
                                                                const std::optional<ptc::DatasetState>& current);

// Saves through megatron/ need zero=0 (Megatron's model_optim_rng.pt does
// not hold ZeRO-1 optimizer state) and a config Megatron's legacy save can
// hold (megatron::CheckLegacySave).
// \error InvalidArgument saying so for a config with zero=1; as CheckLegacySave.
ptc::Status CheckSavable(const ptc::ParallelConfig& config);

// `config` with a save's grid: its tp, pp and ep (pp_layers dropped when pp changes).
ptc::ParallelConfig WithGrid(ptc::ParallelConfig config, int tp, int pp, int ep);

// What a worker's part of the save of `iteration` says besides its pieces:
// the rank files it holds (none, some or all of the grid), their grid, dtype
// and whether they hold optimizer state.
nlohmann::json SavePartExtra(uint64_t iteration, const ptc::MegatronSavePart& part);

// The generation the parts (by worker) of the save of `iteration` make.
struct SettledSave {
  // `current`'s schema and dims with the files' dtype and optimizer state;
  // `current` with the save's tp and pp.
  ptc::ModelLayout layout;
  ptc::megatron::MegatronState state;        // every rank's entries, folded (FoldRanks)
  std::optional<ptc::DatasetState> dataset;  // the data position it commits (SavedDataPosition)
};

// \error InvalidArgument naming the workers or the rank file at fault: no
//        worker holds a rank file; two workers' files disagree on the grid,
//        dtype or optimizer state; a rank file of the grid on no worker;
//        replicas of a piece that differ between two workers; as FoldRanks
//        ModelLayout::Make and SavedDataPosition; Corruption for a part that
//        is not one. `current_spec`, `current` and `dataset`: the generation
//        the save replaces.
ptc::Result<SettledSave> SettleSave(uint64_t iteration, const ptc::ModelSpec& current_spec,
                                    const ptc::ParallelConfig& current, const std::optional<ptc::DatasetState>& dataset,
                                    const std::map<int, ptc::Part>& parts);

// What a worker's part of a DCP save on many workers says besides its
// pieces: the chunk files written on it (OpenDcpPart's file_names), the
// bytes of the Adam steps and param groups in them (`entries`, its
// optimizer_entries: each distinct entry's bytes once, as hex), and for the
// worker that proposed a torch_dist save the manifest's `extra` it commits
// (`manifest_extra`: its iteration, args and data position).
nlohmann::json DcpSavePartExtra(const std::vector<std::string>& files, const nlohmann::json* manifest_extra,
                                const std::vector<ptc::dcp::EntryBytes>& entries = {});

// That the parts (by worker) of a DCP save hold every file of its metadata
// (`files`, OpenDcpPart's all_files) once: so every chunk is in exactly one
// worker's pieces. Returns the manifest extra one part carries (a
// torch_dist save's: then exactly one must), and the optimizer entries of
// every part (for ptc::dcp::PartsOptimizer).
struct SettledDcpSave {
  std::optional<nlohmann::json> manifest_extra;
  std::vector<ptc::dcp::EntryBytes> entries;
};
// \error InvalidArgument naming the file held by no worker, or the two
//        workers holding it; Corruption for a part that is not one (its
//        optimizer entries included), or a manifest extra in two parts, or
//        in none of a torch_dist save's.
ptc::Result<SettledDcpSave> SettleDcpSave(const std::set<std::string>& files, bool torch_dist,
                                          const std::map<int, ptc::Part>& parts);

}  // namespace ptcfs
