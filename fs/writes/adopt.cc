#include "fs/writes/adopt.h"

#include "ptc/dataset/state.h"
#include "ptc/store/model_spec.h"

namespace ptcfs {

ptc::Status AdoptWrite::Run(const std::function<ptc::Status(ptc::Store&)>& write) {
  auto adopt = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(write(ctx_.store()));
    auto generation = ctx_.store().CurrentSnapshot();
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(*generation));
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ConfigFromManifest(*generation));
    std::optional<ptc::DatasetState> dataset;
    if (ctx_.has_dataset()) {
      PTC_ASSIGN_OR_RETURN(dataset, ptc::LoadDatasetState(ctx_.store()));
    }
    PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), std::move(config)));
    return ctx_.MakeSnapshot(generation, std::move(layout), dataset);
  };
  const ptc::Status result = ctx_.RunHere(
      MountState::kRejoining, "a reconfiguration or save is running; the store is written once it ends", "", [&] {
        ptc::Result<std::shared_ptr<const Snapshot>> adopted = ptc::InternalError("adopt not run");
        try {
          adopted = adopt();
        } catch (const std::exception& e) {  // on the caller's thread, no FUSE callback: fail, not end the daemon
          adopted = ptc::InternalError(std::string("internal error while adopting a generation: ") + e.what());
        }
        if (adopted.ok()) ctx_.Serve(*adopted);
        return adopted.status();  // on an error kept as last_error; else the caller's to clear (it may not be done)
      });
  if (result.ok()) ctx_.Collect();
  return result;
}

}  // namespace ptcfs
