// ReadTorchDistState: a torch_dist save's common.pt over the store's Megatron state.
#include "fs/writes/torch_dist.h"

#include <map>
#include <set>

#include "ptc/checkpoint/dcp/dist_optimizer_read.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"
#include "view/save_parts.h"

namespace ptcfs {
namespace {

// The optimizer's groups, common step and other entries (grad_scaler) of a
// torch_dist save's common.pt take the place of the store's.
ptc::Status TakeOptimizerCommon(const ptc::pickle::Value& optimizer, const ptc::RandomAccessFile& file,
                                const ptc::TorchFile& common, const std::string& path, const ptc::ModelSpec& spec,
                                ptc::megatron::MegatronState* state) {
  // The save's parameters with optimizer state are the model's whether or not
  // the store had any before (a store imported from Hugging Face has none):
  // its steps belong to them.
  ptc::ModelSpec saved = spec;
  saved.optimizer = true;
  PTC_ASSIGN_OR_RETURN(const std::vector<ptc::GlobalTensor> globals, ptc::GlobalTensors(saved));
  std::set<std::string> names;
  for (const ptc::GlobalTensor& g : globals) names.insert(g.name);
  std::vector<std::string> params;  // those with optimizer state: each one's step
  for (const ptc::GlobalTensor& g : globals) {
    if (names.count(g.name + ".exp_avg") != 0) params.push_back(g.name);
  }
  auto read = [&](const ptc::pickle::Tensor& t) { return ptc::ReadTensorBytes(file, common, t, path); };
  PTC_ASSIGN_OR_RETURN(ptc::megatron::McoreOptimizerCommonPart part,
                       ptc::megatron::ReadMcoreOptimizerCommon(optimizer, params, read, path));
  state->optimizer = std::move(part.meta);
  if (!state->carried.is_dict()) state->carried = ptc::pickle::Value::Dict();
  if (const ptc::pickle::Value* old = state->carried.Find("optimizer"); old != nullptr) {
    std::set<std::string> unused;
    ptc::pickle::ForEachTensor(*old,
                               [&](const std::string&, const ptc::pickle::Tensor& t) { unused.insert(t.storage_key); });
    std::erase_if(state->tensors, [&](const ptc::megatron::CarriedTensor& c) { return unused.count(c.key) != 0; });
    state->carried.Erase("optimizer");
  }
  if (part.kept.is_none()) return ptc::Status::OK();
  // Storage keys "g<n>" made unique among the carried ones.
  std::set<std::string> taken;
  for (const ptc::megatron::CarriedTensor& c : state->tensors) taken.insert(c.key);
  std::map<std::string, std::string> renamed;
  size_t n = 0;
  for (ptc::megatron::CarriedTensor& c : part.tensors) {
    std::string key;
    do key = "g" + std::to_string(n++);
    while (taken.count(key) != 0);
    renamed[c.key] = key;
    c.key = key;
    state->tensors.push_back(std::move(c));
  }
  ptc::pickle::ForEachTensor(
      part.kept, [&](const std::string&, ptc::pickle::Tensor& t) { t.storage_key = renamed.at(t.storage_key); });
  state->carried.Set("optimizer", std::move(part.kept));
  return ptc::Status::OK();
}

}  // namespace

ptc::Result<TorchDistState> ReadTorchDistState(const ptc::Store& store, const std::string& iter_dir, uint64_t iteration,
                                               const Snapshot& current, ptc::megatron::NameSet names) {
  PTC_RETURN_IF_ERROR(ptc::dcp::CheckMcoreMetadata(store.env(), iter_dir));
  // common.pt: the state dict's entries that are not sharded (args, iteration, ...).
  const std::string common_path = ptc::JoinPath(iter_dir, ptc::dcp::kMcoreCommonFile);
  PTC_ASSIGN_OR_RETURN(auto common_file, store.env()->OpenRead(common_path));
  PTC_ASSIGN_OR_RETURN(ptc::TorchFile common, ptc::ReadTorchFile(*common_file, common_path));
  if (!common.root.is_dict()) return ptc::InvalidArgumentError(common_path + ": not a dict");
  ptc::megatron::MegatronState saved;
  saved.carried = common.root;
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                       SavedDataPosition(saved, iteration, current.dataset()));
  // The store's Megatron state, at this iteration, with the save's args (and
  // no earlier DCP save's entries: this save's state replaces theirs).
  nlohmann::json extra = store.current().extra;
  ptc::dcp::ForgetSavedEntries(&extra);
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state,
                       ptc::megatron::LoadMegatronState(extra, "the store's manifest"));
  state.iteration = iteration;
  if (const ptc::pickle::Value* args = common.root.Find("args"); args != nullptr) {
    if (!state.carried.is_dict()) state.carried = ptc::pickle::Value::Dict();
    state.carried.Set("args", *args);
  }
  if (const ptc::pickle::Value* optimizer = common.root.Find("optimizer"); optimizer != nullptr) {
    // The distributed optimizer's groups and step are in its ShardedObjects, not in common.pt.
    PTC_ASSIGN_OR_RETURN(const bool distributed, ptc::megatron::DpReshardableSave(*optimizer, common_path));
    ptc::pickle::Value taken = *optimizer;
    if (distributed) {
      PTC_ASSIGN_OR_RETURN(
          taken, ptc::dcp::ReadDpReshardableCommon(store.env(), iter_dir, current.spec(), current.config(), names));
    }
    PTC_RETURN_IF_ERROR(TakeOptimizerCommon(taken, *common_file, common, common_path, current.spec(), &state));
  }
  extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(state);
  if (dataset) extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  return TorchDistState{std::move(extra), std::move(dataset)};
}

}  // namespace ptcfs
