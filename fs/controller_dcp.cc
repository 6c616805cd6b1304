// Saves in DCP files, committed as one generation whose pieces are their
// chunks: Controller::IngestDcp (a dcp.save into dcp/; on many workers with
// ApplyDcpSave) and SaveTorchDist (Megatron-Core's torch_dist save into megatron/).
#include <map>
#include <set>

#include "fs/controller.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"
#include "view/save_parts.h"

namespace ptcfs {
namespace {

// A save without optimizer state would lose the store's.
ptc::Status CheckKeepsOptimizer(const ptc::ModelSpec& spec, const ptc::dcp::DcpSource& source, const std::string& dir) {
  if (spec.optimizer && !source.layout.spec().optimizer) {
    return ptc::InvalidArgumentError(dir +
                                     ": the save holds no optimizer state; the store's would be lost "
                                     "(save the optimizer's state too, docs/dcp_format.md)");
  }
  return ptc::Status::OK();
}

}  // namespace

ptc::Status Controller::CommitDcp(const std::string& dir, ptc::dcp::Keys keys, nlohmann::json extra,
                                  std::optional<ptc::DatasetState> dataset,
                                  const std::shared_ptr<const Snapshot>& current,
                                  const std::function<void()>& committed) {
  const ptc::ModelSpec& spec = current->spec();
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                       ptc::dcp::OpenDcp(store_->env(), dir, spec.schema, spec.dims, current->config(), keys));
  PTC_RETURN_IF_ERROR(CheckKeepsOptimizer(spec, source, dir));
  // A save into dcp/ keeps the name it was saved under (dcp/NAME shows the state again).
  const std::string save_name = keys == ptc::dcp::Keys::kMegatronCore ? "" : dir.substr(dir.rfind('/') + 1);
  PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcp(store_, source, std::move(extra), save_name).status());
  PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.layout, worker_, checks_,
                                                   std::move(dataset), source_));
  if (committed) committed();
  Commit(snap);
  return ptc::Status::OK();
}

ptc::Status Controller::IngestDcp(const std::string& dir, const std::string& save,
                                  const std::shared_ptr<const Snapshot>& current,
                                  const std::function<void()>& committed) {
  PTC_ASSIGN_OR_RETURN(
      const MountState before,
      BeginWriting(MountState::kSaving,
                   "a reconfiguration or save is running; save again once .ptcfs/status says serving"));
  JobParticipant* job = nullptr;
  {
    ptc::MutexLock lock(&mu_);
    job = job_;
  }
  ptc::Status result;
  if (job == nullptr) {
    result = CommitDcp(dir, ptc::dcp::Keys::kTorch, store_->current().extra, current->dataset(), current, committed);
  } else {
    result = ProposeDcpSave(dir, save, ptc::dcp::Keys::kTorch, nullptr, current, *job, committed);
    if (!result.ok()) result = ptc::IOError(result.message());  // the save failed (the rename says EIO)
  }
  ptc::MutexLock lock(&mu_);
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("DCP save " + dir + ": " + result.message());
  return result;
}

ptc::Status Controller::SaveTorchDist(const std::string& iter_dir, uint64_t iteration,
                                      const std::shared_ptr<const Snapshot>& current) {
  PTC_ASSIGN_OR_RETURN(TorchDistState state, ReadTorchDistState(iter_dir, iteration, current));
  return CommitDcp(iter_dir, ptc::dcp::Keys::kMegatronCore, std::move(state.extra), std::move(state.dataset), current,
                   {});
}

ptc::Status Controller::ProposeDcpSave(const std::string& dir, const std::string& save, ptc::dcp::Keys keys,
                                       const TorchDistState* state, const std::shared_ptr<const Snapshot>& current,
                                       JobParticipant& job, const std::function<void()>& committed) {
  PTC_ASSIGN_OR_RETURN(const std::string metadata, ptc::dcp::ReadMetadata(store_->env(), dir));
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<AgreedChange> change, job.ProposeDcpSave(save, metadata));
  ptc::Status s = SaveDcpInCluster(dir, metadata, keys, state, current, *change, committed);
  if (!s.ok()) change->Failed(s);
  return s;
}

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

ptc::Result<Controller::TorchDistState> Controller::ReadTorchDistState(const std::string& iter_dir, uint64_t iteration,
                                                                       const std::shared_ptr<const Snapshot>& current) {
  PTC_RETURN_IF_ERROR(ptc::dcp::CheckMcoreMetadata(store_->env(), iter_dir));
  // common.pt: the state dict's entries that are not sharded (args, iteration, ...).
  const std::string common_path = ptc::JoinPath(iter_dir, ptc::dcp::kMcoreCommonFile);
  PTC_ASSIGN_OR_RETURN(auto common_file, store_->env()->OpenRead(common_path));
  PTC_ASSIGN_OR_RETURN(ptc::TorchFile common, ptc::ReadTorchFile(*common_file, common_path));
  if (!common.root.is_dict()) return ptc::InvalidArgumentError(common_path + ": not a dict");
  ptc::megatron::MegatronState saved;
  saved.carried = common.root;
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                       SavedDataPosition(saved, iteration, current->dataset()));
  // The store's Megatron state, at this iteration, with the save's args (and
  // no earlier DCP save's entries: this save's state replaces theirs).
  nlohmann::json extra = store_->current().extra;
  ptc::dcp::ForgetSavedEntries(&extra);
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state,
                       ptc::megatron::LoadMegatronState(extra, "the store's manifest"));
  state.iteration = iteration;
  if (const ptc::pickle::Value* args = common.root.Find("args"); args != nullptr) {
    if (!state.carried.is_dict()) state.carried = ptc::pickle::Value::Dict();
    state.carried.Set("args", *args);
  }
  if (const ptc::pickle::Value* optimizer = common.root.Find("optimizer"); optimizer != nullptr) {
    PTC_RETURN_IF_ERROR(TakeOptimizerCommon(*optimizer, *common_file, common, common_path, current->spec(), &state));
  }
  extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(state);
  if (dataset) extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  return TorchDistState{std::move(extra), std::move(dataset)};
}

ptc::Status Controller::ApplyDcpSave(const std::string& dir, std::string metadata, ptc::dcp::Keys keys,
                                     const std::shared_ptr<const Snapshot>& current,
                                     std::shared_ptr<AgreedChange> change, std::function<void(bool committed)> done) {
  auto started = BeginWriting(MountState::kSaving, "a reconfiguration or save is running");
  if (!started.ok()) {  // `done` is not called
    change->Failed(started.status());
    RecordError("DCP save " + dir + ": " + started.status().message());
    return started.status();
  }
  ptc::MutexLock lock(&mu_);
  worker_thread_ = std::thread(
      [this, dir, metadata = std::move(metadata), keys, current, change = std::move(change), done = std::move(done)] {
        bool committed = false;
        const ptc::Status result = SaveDcpInCluster(dir, metadata, keys, nullptr, current, *change, [&] {
          committed = true;
          done(true);
        });
        if (!result.ok()) change->Failed(result);
        if (!committed) done(false);
        ptc::MutexLock lock(&mu_);
        state_ = result.ok() ? MountState::kServing : MountState::kFailed;
        if (!result.ok()) SetLastError("DCP save " + dir + ": " + result.message());
      });
  return ptc::Status::OK();
}

ptc::Status Controller::SaveDcpInCluster(const std::string& dir, const std::string& metadata, ptc::dcp::Keys keys,
                                         const TorchDistState* state, const std::shared_ptr<const Snapshot>& current,
                                         AgreedChange& change, const std::function<void()>& committed) {
  const ptc::ModelSpec& spec = current->spec();
  const bool torch_dist = keys == ptc::dcp::Keys::kMegatronCore;
  // This worker's part: the chunk files written here (none on a worker without ranks).
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                       ptc::dcp::OpenDcpPart(store_->env(), dir, metadata, spec.schema, spec.dims, current->config(),
                                             keys, /*part=*/true));
  PTC_RETURN_IF_ERROR(CheckKeepsOptimizer(spec, source, dir));
  PTC_ASSIGN_OR_RETURN(auto writer, store_->BeginGeneration());
  ptc::ImportResult written;
  PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcpChunks(*writer, source, worker_, &written));
  ptc::GenerationManifest meta;
  PTC_RETURN_IF_ERROR(ptc::DescribeModel(source.layout.spec(), source.layout.config(), &meta));
  std::vector<ptc::TensorRecord> tensors;
  if (!source.chunks.empty()) tensors = meta.tensors;
  auto settle = [&](const std::map<int, ptc::Part>& parts) -> ptc::Result<std::string> {
    PTC_ASSIGN_OR_RETURN(const SettledDcpSave settled, SettleDcpSave(source.all_files, torch_dist, parts));
    if (source.optimizer_part) {  // refused before a commit
      PTC_RETURN_IF_ERROR(ptc::dcp::PartsOptimizer(*source.optimizer_part, settled.entries, dir).status());
      PTC_RETURN_IF_ERROR(ptc::dcp::PartsEntries(*source.optimizer_part, settled.entries, dir).status());
    }
    return source.layout.config().ToString();
  };
  PTC_ASSIGN_OR_RETURN(
      const auto parts,
      change.BeforeSaveCommit(*writer, tensors,
                              DcpSavePartExtra(source.file_names, state ? &state->extra : nullptr,
                                               source.optimizer_part ? source.optimizer_part->entries
                                                                     : std::vector<ptc::dcp::EntryBytes>{}),
                              settle));
  // Every worker settles the same files (the one that committed did so before it committed).
  PTC_ASSIGN_OR_RETURN(SettledDcpSave settled, SettleDcpSave(source.all_files, torch_dist, parts));
  std::optional<ptc::DatasetState> dataset = current->dataset();
  meta.extra = store_->current().extra;
  // Adam's steps and the param groups, from whichever workers' files hold them.
  std::optional<ptc::megatron::OptimizerMeta> optimizer;
  if (source.optimizer_part) {
    PTC_ASSIGN_OR_RETURN(optimizer, ptc::dcp::PartsOptimizer(*source.optimizer_part, settled.entries, dir));
  }
  // The save's other entries, and the name it was saved under, in place of any before.
  std::vector<ptc::dcp::CarriedEntry> entries;
  if (source.optimizer_part) {
    PTC_ASSIGN_OR_RETURN(entries, ptc::dcp::PartsEntries(*source.optimizer_part, settled.entries, dir));
  }
  ptc::dcp::SetSavedEntries(entries, torch_dist ? "" : dir.substr(dir.rfind('/') + 1), &meta.extra);
  if (optimizer) {
    PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState megatron,
                         ptc::megatron::LoadMegatronState(meta.extra, "the store's manifest"));
    megatron.optimizer = std::move(*optimizer);
    meta.extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(megatron);
  }
  if (settled.manifest_extra) {  // a torch_dist save: its iteration, args and data position
    meta.extra = std::move(*settled.manifest_extra);
    if (meta.extra.contains("dataset")) {
      PTC_ASSIGN_OR_RETURN(dataset,
                           ptc::DecodeDatasetState("the torch_dist save's data position", meta.extra["dataset"]));
    }
  }
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.layout, worker_, checks_,
                                                   std::move(dataset), source_));
  if (committed) committed();
  Commit(snap);
  return ptc::Status::OK();
}

}  // namespace ptcfs
