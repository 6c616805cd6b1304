// Controller::Adopt: a generation committed outside a change or save (a
// cluster worker catching up with its job), served as a commit is.
#include "fs/controller.h"
#include "ptc/dataset/state.h"
#include "ptc/store/model_spec.h"

namespace ptcfs {

ptc::Status Controller::Adopt(const std::function<ptc::Status(ptc::Store&)>& write) {
  PTC_ASSIGN_OR_RETURN(
      const MountState before,
      BeginWriting(MountState::kRejoining, "a reconfiguration or save is running; the store is written once it ends"));
  auto adopt = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(write(*store_));
    auto generation = store_->CurrentSnapshot();
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(*generation));
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ConfigFromManifest(*generation));
    std::optional<ptc::DatasetState> dataset;
    if (source_) {
      PTC_ASSIGN_OR_RETURN(dataset, ptc::LoadDatasetState(*store_));
    }
    PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), std::move(config)));
    return Snapshot::Create(*store_, generation, std::move(layout), worker_, checks_, dataset, source_);
  };
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("adopt not run");
  try {
    result = adopt();
  } catch (const std::exception& e) {  // on the caller's thread, no FUSE callback: fail instead of ending the daemon
    result = ptc::InternalError(std::string("internal error while adopting a generation: ") + e.what());
  }
  if (result.ok()) serve_(*result);
  {
    ptc::MutexLock lock(&mu_);
    state_ = result.ok() ? MountState::kServing : before;
    if (!result.ok()) SetLastError(result.status().message());  // else the caller's to clear (it may not be done)
  }
  if (result.ok()) Collect();
  return result.status();
}

}  // namespace ptcfs
