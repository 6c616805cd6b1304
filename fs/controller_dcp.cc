// Saves in DCP files, committed as one generation whose pieces are their
// chunks: Controller::IngestDcp (a dcp.save into dcp/) and SaveTorchDist
// (Megatron-Core's torch_dist save into megatron/).
#include "fs/controller.h"
#include "fs/save_parts.h"
#include "ptc/checkpoint/dcp_read.h"
#include "ptc/checkpoint/megatron.h"
#include "ptc/format/torch_file.h"

namespace ptcfs {

ptc::Status Controller::CommitDcp(const std::string& dir, ptc::dcp::Keys keys, nlohmann::json extra,
                                  std::optional<ptc::DatasetState> dataset,
                                  const std::shared_ptr<const Snapshot>& current,
                                  const std::function<void()>& committed) {
  const ptc::ModelSpec& spec = current->spec();
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                       ptc::dcp::OpenDcp(store_->env(), dir, spec.schema, spec.dims, current->config(), keys));
  if (spec.optimizer && !source.layout.spec().optimizer) {
    return ptc::InvalidArgumentError(dir +
                                     ": the save holds no optimizer state; the store's would be lost "
                                     "(save the optimizer's state too, docs/dcp_format.md)");
  }
  PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcp(store_, source, std::move(extra)).status());
  PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.layout, worker_, checks_,
                                                   std::move(dataset), source_));
  if (committed) committed();
  Commit(snap);
  return ptc::Status::OK();
}

ptc::Status Controller::IngestDcp(const std::string& dir, const std::shared_ptr<const Snapshot>& current,
                                  const std::function<void()>& committed) {
  {
    ptc::MutexLock lock(&mu_);
    if (job_ != nullptr) {
      return ptc::FailedPreconditionError(
          "DCP saves through a mount that is one worker of a cluster are not "
          "supported yet (docs/dcp_format.md)");
    }
  }
  PTC_ASSIGN_OR_RETURN(
      const MountState before,
      BeginWriting(MountState::kSaving,
                   "a reconfiguration or save is running; save again once .ptcfs/status says serving"));
  const ptc::Status result =
      CommitDcp(dir, ptc::dcp::Keys::kTorch, store_->current().extra, current->dataset(), current, committed);
  ptc::MutexLock lock(&mu_);
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("DCP save " + dir + ": " + result.message());
  return result;
}

ptc::Status Controller::SaveTorchDist(const std::string& iter_dir, uint64_t iteration,
                                      const std::shared_ptr<const Snapshot>& current) {
  // common.pt: the state dict's entries that are not sharded (args, iteration, ...).
  const std::string common_path = ptc::JoinPath(iter_dir, ptc::dcp::kMcoreCommonFile);
  PTC_ASSIGN_OR_RETURN(auto common_file, store_->env()->OpenRead(common_path));
  PTC_ASSIGN_OR_RETURN(ptc::TorchFile common, ptc::ReadTorchFile(*common_file, common_path));
  if (!common.root.is_dict()) return ptc::InvalidArgumentError(common_path + ": not a dict");
  ptc::megatron::MegatronState saved;
  saved.carried = common.root;
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                       SavedDataPosition(saved, iteration, current->dataset()));
  // The store's Megatron state, at this iteration, with the save's args.
  nlohmann::json extra = store_->current().extra;
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state,
                       ptc::megatron::LoadMegatronState(extra, "the store's manifest"));
  state.iteration = iteration;
  if (const ptc::pickle::Value* args = common.root.Find("args"); args != nullptr) {
    if (!state.carried.is_dict()) state.carried = ptc::pickle::Value::Dict();
    state.carried.Set("args", *args);
  }
  extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(state);
  if (dataset) extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  return CommitDcp(iter_dir, ptc::dcp::Keys::kMegatronCore, std::move(extra), dataset, current, {});
}

}  // namespace ptcfs
