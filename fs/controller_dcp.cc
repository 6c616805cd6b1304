// Controller::IngestDcp: a PyTorch DCP save written into dcp/ (dcp.save),
// committed as one generation whose pieces are its chunks.
#include "fs/controller.h"
#include "ptc/checkpoint/dcp_read.h"

namespace ptcfs {

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
  auto save = [&]() -> ptc::Status {
    const ptc::ModelSpec& spec = current->spec();
    PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                         ptc::dcp::OpenDcp(store_->env(), dir, spec.schema, spec.dims, current->config()));
    if (spec.optimizer && !source.layout.spec().optimizer) {
      return ptc::InvalidArgumentError(dir +
                                       ": the save holds no optimizer state; the store's would be lost "
                                       "(save the optimizer's state too, docs/dcp_format.md)");
    }
    PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcp(store_, source, store_->current().extra).status());
    PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.layout, worker_,
                                                     checks_, current->dataset(), source_));
    committed();
    Commit(snap);
    return ptc::Status::OK();
  };
  const ptc::Status result = save();
  ptc::MutexLock lock(&mu_);
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("DCP save " + dir + ": " + result.message());
  return result;
}

}  // namespace ptcfs
