// What a Megatron-Core torch_dist save (iter_N/ with metadata.json, in DCP
// files in Megatron-Core's keys) makes of the manifest: its common.pt's
// args, iteration, optimizer groups and data position over the store's
// Megatron state. The save itself is a DcpSaveWrite.
//
// Thread safety: reads the store's current manifest (the caller holds the
// writer role).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/dataset/state.h"
#include "ptc/store/store.h"
#include "view/snapshot.h"

namespace ptcfs {

struct TorchDistState {
  nlohmann::json extra;  // the manifest's extra: the store's Megatron state at the iteration, with the save's args
  std::optional<ptc::DatasetState> dataset;  // the position it commits
};

// The torch_dist save of `iteration` in `iter_dir`, over `current`. A save of
// Megatron-Core's DistributedOptimizer (dp_reshardable) has its groups and
// step in its ShardedObjects, read by the buffers of the current config in
// the registration order of `names` (the mount's --names).
// \error as CheckMcoreMetadata, ReadTorchFile (common.pt), SavedDataPosition,
//        LoadMegatronState, DpReshardableSave, ReadDpReshardableCommon and
//        ReadMcoreOptimizerCommon; InvalidArgument for a common.pt that is no dict.
ptc::Result<TorchDistState> ReadTorchDistState(const ptc::Store& store, const std::string& iter_dir, uint64_t iteration,
                                               const Snapshot& current, ptc::megatron::NameSet names);

}  // namespace ptcfs
