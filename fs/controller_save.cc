// Controller::Ingest and ApplySave: a Megatron save through megatron/,
// committed with its data position as one generation; on one worker, or as
// a change of a cluster job whose workers each hold some of its rank files
// (view/save_parts.h).
#include "fs/controller.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/megatron/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/store/model_spec.h"
#include "view/save_parts.h"

namespace ptcfs {

ptc::Status Controller::Ingest(const std::string& staging_root, uint64_t iteration,
                               const std::shared_ptr<const Snapshot>& current) {
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
  const std::string name = ptc::megatron::IterationDirName(iteration);
  const std::string iter_dir = ptc::JoinPath(staging_root, name);
  if (job == nullptr) {
    result = Save(staging_root, iteration, current);
  } else if (store_->env()->Exists(ptc::JoinPath(iter_dir, ptc::dcp::kMcoreMetadataFile))) {
    auto state = ReadTorchDistState(iter_dir, iteration, current);
    result = state.ok() ? ProposeDcpSave(iter_dir, name, ptc::dcp::Keys::kMegatronCore, &*state, current, *job, {})
                        : state.status();
    if (!result.ok()) result = ptc::IOError(result.message());
  } else if (auto change = job->ProposeSave(iteration); !change.ok()) {
    result = change.status();
  } else {
    result = SaveInCluster(staging_root, iteration, current, **change);
    if (!result.ok()) {
      (*change)->Failed(result);
      result = ptc::IOError(result.message());  // the save failed (close() says EIO), the mount is not busy
    }
  }
  ptc::MutexLock lock(&mu_);
  // A cluster save that failed leaves every worker as it was: no state of its own here either.
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("save of iteration " + std::to_string(iteration) + ": " + result.message());
  return result;
}

ptc::Status Controller::ApplySave(const std::string& staging_root, uint64_t iteration,
                                  const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                                  std::function<void(bool committed)> done) {
  auto started = BeginWriting(MountState::kSaving, "a reconfiguration or save is running");
  if (!started.ok()) {  // `done` is not called
    change->Failed(started.status());
    RecordError("save of iteration " + std::to_string(iteration) + ": " + started.status().message());
    return started.status();
  }
  ptc::MutexLock lock(&mu_);
  worker_thread_ =
      std::thread([this, staging_root, iteration, current, change = std::move(change), done = std::move(done)] {
        const ptc::Status result = SaveInCluster(staging_root, iteration, current, *change);
        if (!result.ok()) change->Failed(result);
        done(result.ok());
        ptc::MutexLock lock(&mu_);
        state_ = result.ok() ? MountState::kServing : MountState::kFailed;
        if (!result.ok()) SetLastError("save of iteration " + std::to_string(iteration) + ": " + result.message());
      });
  return ptc::Status::OK();
}

ptc::Status Controller::Save(const std::string& staging_root, uint64_t iteration,
                             const std::shared_ptr<const Snapshot>& current) {
  const std::string iter_dir = ptc::JoinPath(staging_root, ptc::megatron::IterationDirName(iteration));
  if (store_->env()->Exists(ptc::JoinPath(iter_dir, ptc::dcp::kMcoreMetadataFile))) {
    return SaveTorchDist(iter_dir, iteration, current);
  }
  const ptc::ModelSpec& spec = current->spec();
  PTC_RETURN_IF_ERROR(CheckSavable(current->config()));
  ptc::MegatronImportOptions o{staging_root, spec.schema, spec.dims, iteration, std::nullopt};
  PTC_ASSIGN_OR_RETURN(ptc::CheckpointSource source, ptc::OpenMegatronCheckpoint(store_->env(), o));
  // One generation, one state: the model, the optimizer and the data position together.
  PTC_ASSIGN_OR_RETURN(const ptc::megatron::MegatronState saved,
                       ptc::megatron::LoadMegatronState(source.extra, "the saved state dict"));
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                       SavedDataPosition(saved, iteration, current->dataset()));
  if (dataset) source.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  source.config = WithGrid(current->config(), source.config.tp, source.config.pp);
  source.adopt_files = true;  // the staged files become the pieces' files: no tensor byte written twice
  PTC_RETURN_IF_ERROR(ptc::ImportInto(store_, source).status());
  PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(source.spec, source.config));
  PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), std::move(layout), worker_,
                                                   checks_, dataset, source_));
  Commit(snap);
  return ptc::Status::OK();
}

ptc::Status Controller::SaveInCluster(const std::string& staging_root, uint64_t iteration,
                                      const std::shared_ptr<const Snapshot>& current, AgreedChange& change) {
  const ptc::ModelSpec& spec = current->spec();
  const ptc::ParallelConfig& config = current->config();
  PTC_RETURN_IF_ERROR(CheckSavable(config));
  if (store_->env()->Exists(ptc::JoinPath(ptc::JoinPath(staging_root, ptc::megatron::IterationDirName(iteration)),
                                          ptc::dcp::kMcoreMetadataFile))) {
    return ptc::InvalidArgumentError(
        "iteration " + std::to_string(iteration) +
        " is a torch_dist save here (metadata.json) but the job takes a legacy save of it: write the tracker "
        "on the mount that holds its .metadata");
  }
  // This worker's part: the rank files staged here, written into pieces of its own.
  ptc::MegatronImportOptions o{staging_root, spec.schema, spec.dims, iteration, config};
  PTC_ASSIGN_OR_RETURN(ptc::MegatronSavePart part, ptc::OpenMegatronSavePart(store_->env(), o));
  PTC_ASSIGN_OR_RETURN(auto writer, store_->BeginGeneration());
  std::vector<ptc::TensorRecord> tensors;
  if (!part.kept.empty()) {
    part.source.config = WithGrid(config, part.source.config.tp, part.source.config.pp);
    part.source.adopt_files = true;  // as on one worker (Save)
    std::vector<int> ranks;
    for (const ptc::KeptRank& k : part.kept) ranks.push_back(part.source.config.RankOf(ptc::RankCoords{k.tp, 0, k.pp}));
    PTC_RETURN_IF_ERROR(ptc::WriteRanks(store_->env(), writer.get(), part.source, ranks, worker_).status());
    ptc::GenerationManifest described;
    PTC_RETURN_IF_ERROR(ptc::DescribeModel(part.source.spec, part.source.config, &described));
    tensors = std::move(described.tensors);
  }
  auto settle = [&](const std::map<int, ptc::Part>& parts) -> ptc::Result<std::string> {
    PTC_ASSIGN_OR_RETURN(SettledSave s, SettleSave(iteration, spec, config, current->dataset(), parts));
    return s.layout.config().ToString();
  };
  PTC_ASSIGN_OR_RETURN(auto parts, change.BeforeSaveCommit(*writer, tensors, SavePartExtra(iteration, part), settle));
  // Every worker settles the same generation from the same parts (the one
  // that committed it did so before it committed: nothing fails here but I/O).
  PTC_ASSIGN_OR_RETURN(SettledSave settled, SettleSave(iteration, spec, config, current->dataset(), parts));
  ptc::GenerationManifest meta;
  meta.extra = store_->current().extra;
  ptc::dcp::ForgetSavedEntries(&meta.extra);  // a Megatron save's state replaces a DCP save's
  meta.extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(settled.state);
  if (settled.dataset) meta.extra["dataset"] = ptc::EncodeDatasetState(*settled.dataset);
  PTC_RETURN_IF_ERROR(ptc::DescribeModel(settled.layout.spec(), settled.layout.config(), &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), std::move(settled.layout),
                                                   worker_, checks_, settled.dataset, source_));
  Commit(snap);
  return ptc::Status::OK();
}

void Controller::Commit(const std::shared_ptr<const Snapshot>& snap) {
  serve_(snap);
  {
    ptc::MutexLock lock(&mu_);
    last_error_.clear();  // committed
  }
  Collect();
}

}  // namespace ptcfs
