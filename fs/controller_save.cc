// Controller::Ingest: a Megatron save through megatron/, committed with its
// data position as one generation.
#include "fs/controller.h"
#include "ptc/checkpoint/megatron.h"
#include "ptc/checkpoint/megatron_import.h"

namespace ptcfs {
namespace {

// The data position a save commits with its model. Megatron counts
// args.consumed_train_samples over the whole run, the global batch B per step
// and never reset at an epoch (docs/dataset_format.md, "A save's position"):
// T = consumed / B steps, so epoch T / S and step T % S of the store's epochs
// of S = ceil(N / B) steps (the end of an epoch is step 0 of the next).
// `current` when the store has no dataset or the save's args do not say.
// Also checks that the save's 'iteration' is the one the latest file names.
ptc::Result<std::optional<ptc::DatasetState>> SavedDataPosition(const ptc::CheckpointSource& source, uint64_t iteration,
                                                                const std::optional<ptc::DatasetState>& current) {
  const std::string what = "the saved state dict";
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState saved, ptc::megatron::LoadMegatronState(source.extra, what));
  if (const ptc::pickle::Value* it = saved.carried.Find("iteration");
      it != nullptr && it->kind() == ptc::pickle::Kind::kInt && it->as_int() != static_cast<int64_t>(iteration)) {
    return ptc::InvalidArgumentError(what + " says iteration " + std::to_string(it->as_int()) + ", " +
                                     std::string(ptc::megatron::kLatestFile) + " names " + std::to_string(iteration));
  }
  if (!current) return current;
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> consumed,
                       ptc::megatron::ArgsInt(saved.carried, "consumed_train_samples", what));
  if (!consumed) return current;
  const std::string name = "args.consumed_train_samples " + std::to_string(*consumed);
  const uint64_t batch = current->global_batch;
  if (*consumed < 0 || static_cast<uint64_t>(*consumed) % batch != 0) {
    return ptc::InvalidArgumentError(name + " is not a position of the dataset: a multiple of its global batch " +
                                     std::to_string(batch) + " (the samples of every step since the start) is");
  }
  const uint64_t steps = static_cast<uint64_t>(*consumed) / batch, per_epoch = current->steps_per_epoch();
  auto moved = ptc::StateAtStep(*current, steps % per_epoch, steps / per_epoch);
  if (!moved.ok()) return ptc::InvalidArgumentError(name + ": " + moved.status().message());
  return std::optional<ptc::DatasetState>(*moved);
}
}  // namespace

ptc::Status Controller::Ingest(const std::string& staging_root, uint64_t iteration,
                               const std::shared_ptr<const Snapshot>& current) {
  bool in_cluster = false;
  {
    ptc::MutexLock lock(&mu_);
    in_cluster = job_ != nullptr;
  }
  if (in_cluster) {
    const ptc::Status s = ptc::FailedPreconditionError(
        "megatron/: saves through a mount that is one worker of a cluster are not supported yet "
        "(a save would commit a generation the other workers do not have)");
    RecordError(s.message());
    return s;
  }
  PTC_ASSIGN_OR_RETURN(
      const MountState before,
      BeginWriting(MountState::kSaving, "a reconfiguration or save is running; save again once .ptcfs/status says serving"));
  auto result = [&]() -> ptc::Status {
    const ptc::ModelSpec& spec = current->spec();
    ptc::ParallelConfig config = current->config();
    if (config.zero == 1) {
      return ptc::InvalidArgumentError(
          "saves through megatron/ need zero=0: Megatron's model_optim_rng.pt does not "
          "hold ZeRO-1 optimizer state");
    }
    ptc::MegatronImportOptions o{staging_root, spec.schema, spec.dims, iteration, std::nullopt};
    PTC_ASSIGN_OR_RETURN(ptc::CheckpointSource source, ptc::OpenMegatronCheckpoint(store_->env(), o));
    // One generation, one state: the model, the optimizer and the data position together.
    PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                         SavedDataPosition(source, iteration, current->dataset()));
    if (dataset) source.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
    if (source.config.tp != config.tp || source.config.pp != config.pp) {
      if (source.config.pp != config.pp) config.pp_layers.clear();
      config.tp = source.config.tp;
      config.pp = source.config.pp;
    }
    source.config = config;
    PTC_RETURN_IF_ERROR(ptc::ImportInto(store_, source).status());
    PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.spec, config, worker_,
                                                     checks_, dataset, source_));
    serve_(snap);
    {
      ptc::MutexLock lock(&mu_);
      last_error_.clear();  // committed
    }
    Collect();
    return ptc::Status::OK();
  }();
  ptc::MutexLock lock(&mu_);
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("save of iteration " + std::to_string(iteration) + ": " + result.message());
  return result;
}

}  // namespace ptcfs
