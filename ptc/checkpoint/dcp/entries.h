// The entries of a DCP save that are neither the model's tensors nor Adam's
// (CarriedEntry, dcp/read.h): torchtitan's train_state, lr_scheduler and
// dataloader, and any object a dcp.save holds. A store keeps them as saved, in
// its manifest (kEntriesKey), with the name the save was made under
// (kSaveNameKey); PlanCheckpoint renders them back into every DCP tree, so
// that a job resumes its step counter, its schedule and its data position
// (docs/dcp_format.md, "What a save carries").
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/read.h"

namespace ptc::dcp {

// The manifest's keys (GenerationManifest::extra): the carried entries, and
// the directory name of the DCP save that made the generation ("step-9").
inline constexpr const char* kEntriesKey = "dcp_entries";
inline constexpr const char* kSaveNameKey = "dcp_save";

// The largest entry carried: it lives in the manifest.
inline constexpr uint64_t kMaxEntryBytes = 16ull << 20;

using OpenFileFn = std::function<Result<const RandomAccessFile*>(const std::string& file)>;

// Whether the save's entry `key` is carried (SavedEntries): an object
// (BytesStorageMetadata) that is no step or param group; with kTorchtitan also
// the tensors of train_state, lr_scheduler and dataloader. Never with
// kMegatronCore (its objects are Megatron-Core's own, common.pt its state).
bool CarriedObjectKey(const std::string& key, Keys keys);
bool CarriedTensorKey(const std::string& key, Keys keys);
// torchtitan's MoE load-balancing bias, a persistent buffer of every MoE
// layer: layers.L.moe.expert_bias_E, float32 [experts]. Carried as saved; a
// tree whose store has none renders zeros (its initial value; ExpertBiasObjects).
// A store whose schema has the router's bias (hf::ExpertBiasSchema, DeepSeek-V3)
// keeps it as that tensor, under this key (TorchtitanTensors), not carried.
bool ExpertBiasKey(const std::string& key);

// The expert_bias_E objects of a kTorchtitan plan's MoE layers that neither
// `carried` nor the plan's tensors have: zeros.
// \error as torch.save's planning.
Result<std::vector<Object>> ExpertBiasObjects(const std::vector<Tensor>& tensors,
                                              const std::vector<CarriedEntry>& carried);

// The carried entries of `saved`, read through `open`, in the metadata's order;
// a key of `model` is the model's tensor, not carried (expert_bias_E of a
// schema with the router's bias).
// \error InvalidArgument naming the key: a carried tensor that is not one
//        0-dim chunk, an entry without a storage record, one larger than
//        kMaxEntryBytes or past its file's end; as `open`.
Result<std::vector<CarriedEntry>> SavedEntries(const SavedCheckpoint& saved, const std::vector<Tensor>& model,
                                               Keys keys, const OpenFileFn& open,
                                               const std::string& what);

// The files of a save taken on many workers, served from the bytes the parts
// carry (EntryBytes): a read of bytes no part carries fails naming the file.
class EntriesFiles {
 public:
  // \error InvalidArgument when two parts give one file different sizes.
  static Result<EntriesFiles> Make(const std::vector<EntryBytes>& entries, const std::string& what);
  // \error InvalidArgument "no worker's part holds FILE".
  Result<const RandomAccessFile*> Open(const std::string& file) const;

 private:
  std::map<std::string, std::shared_ptr<RandomAccessFile>> files_;
};

// SavedEntries of a save taken on many workers (as PartsOptimizer).
Result<std::vector<CarriedEntry>> PartsEntries(const OptimizerPart& part, const std::vector<EntryBytes>& entries,
                                               const std::string& what);

// `extra` with the entries of a DCP save (`entries`, and the name `save` of
// its directory, "" for none) in place of any earlier save's.
void SetSavedEntries(const std::vector<CarriedEntry>& entries, const std::string& save, nlohmann::json* extra);
// `extra` without them: a save of another kind made the generation.
void ForgetSavedEntries(nlohmann::json* extra);

// The carried entries of a manifest's extra.
// \error InvalidArgument naming `what` when they do not decode.
Result<std::vector<CarriedEntry>> EntriesOf(const nlohmann::json& extra, const std::string& what);

// The objects that render `entries` in a DCP tree, each nested under its
// dotted key's parts (planner_data).
std::vector<Object> EntryObjects(const std::vector<CarriedEntry>& entries);

}  // namespace ptc::dcp
