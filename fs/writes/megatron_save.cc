// MegatronSaveWrite: a legacy Megatron save, alone or as a worker's part of
// a change of the job.
#include "fs/writes/megatron_save.h"

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/megatron/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/store/model_spec.h"
#include "view/save_parts.h"

namespace ptcfs {

ptc::Status MegatronSaveWrite::Run(AgreedChange& change) { return change.alone() ? SaveWhole() : SavePart(change); }

ptc::Status MegatronSaveWrite::SaveWhole() {
  ptc::Store& store = ctx_.store();
  const ptc::ModelSpec& spec = current_->spec();
  PTC_RETURN_IF_ERROR(CheckSavable(current_->config()));
  ptc::MegatronImportOptions o{staging_root_, spec.schema, spec.dims, iteration_, std::nullopt};
  PTC_ASSIGN_OR_RETURN(ptc::CheckpointSource source, ptc::OpenMegatronCheckpoint(store.env(), o));
  // One generation, one state: the model, the optimizer and the data position together.
  PTC_ASSIGN_OR_RETURN(const ptc::megatron::MegatronState saved,
                       ptc::megatron::LoadMegatronState(source.extra, "the saved state dict"));
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                       SavedDataPosition(saved, iteration_, current_->dataset()));
  if (dataset) source.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  source.config = WithGrid(current_->config(), source.config.tp, source.config.pp, source.config.ep);
  source.adopt_files = true;  // the staged files become the pieces' files: no tensor byte written twice
  PTC_RETURN_IF_ERROR(ptc::ImportInto(&store, source).status());
  PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(source.spec, source.config));
  PTC_ASSIGN_OR_RETURN(auto snap, ctx_.MakeSnapshot(std::move(layout), dataset));
  ctx_.Commit(snap);
  return ptc::Status::OK();
}

ptc::Status MegatronSaveWrite::SavePart(AgreedChange& change) {
  ptc::Store& store = ctx_.store();
  const ptc::ModelSpec& spec = current_->spec();
  const ptc::ParallelConfig& config = current_->config();
  PTC_RETURN_IF_ERROR(CheckSavable(config));
  if (store.env()->Exists(ptc::JoinPath(ptc::JoinPath(staging_root_, ptc::megatron::IterationDirName(iteration_)),
                                        ptc::dcp::kMcoreMetadataFile))) {
    return ptc::InvalidArgumentError(
        "iteration " + std::to_string(iteration_) +
        " is a torch_dist save here (metadata.json) but the job takes a legacy save of it: write the tracker "
        "on the mount that holds its .metadata");
  }
  // This worker's part: the rank files staged here, written into pieces of its own.
  ptc::MegatronImportOptions o{staging_root_, spec.schema, spec.dims, iteration_, config};
  PTC_ASSIGN_OR_RETURN(ptc::MegatronSavePart part, ptc::OpenMegatronSavePart(store.env(), o));
  PTC_ASSIGN_OR_RETURN(auto writer, store.BeginGeneration());
  std::vector<ptc::TensorRecord> tensors;
  if (!part.kept.empty()) {
    part.source.config = WithGrid(config, part.source.config.tp, part.source.config.pp, part.source.config.ep);
    part.source.adopt_files = true;  // as alone (SaveWhole)
    std::vector<int> ranks;
    for (const ptc::KeptRank& k : part.kept) {
      const std::optional<int> rank = ptc::megatron::LegacySaveRank(part.source.config, k.tp, k.pp, k.ep);
      if (!rank) {
        return ptc::InvalidArgumentError(k.file + ": no rank of config " + part.source.config.ToString() +
                                         " saves this file");
      }
      ranks.push_back(*rank);
    }
    PTC_RETURN_IF_ERROR(ptc::WriteRanks(store.env(), writer.get(), part.source, ranks, ctx_.worker()).status());
    ptc::GenerationManifest described;
    PTC_RETURN_IF_ERROR(ptc::DescribeModel(part.source.spec, part.source.config, &described));
    tensors = std::move(described.tensors);
  }
  auto settle = [&](const std::map<int, ptc::Part>& parts) -> ptc::Result<std::string> {
    PTC_ASSIGN_OR_RETURN(SettledSave s, SettleSave(iteration_, spec, config, current_->dataset(), parts));
    return s.layout.config().ToString();
  };
  PTC_ASSIGN_OR_RETURN(auto parts, change.BeforeSaveCommit(*writer, tensors, SavePartExtra(iteration_, part), settle));
  // Every worker settles the same generation from the same parts (the one
  // that committed it did so before it committed: nothing fails here but I/O).
  PTC_ASSIGN_OR_RETURN(SettledSave settled, SettleSave(iteration_, spec, config, current_->dataset(), parts));
  ptc::GenerationManifest meta;
  meta.extra = store.current().extra;
  ptc::dcp::ForgetSavedEntries(&meta.extra);  // a Megatron save's state replaces a DCP save's
  meta.extra[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(settled.state);
  if (settled.dataset) meta.extra["dataset"] = ptc::EncodeDatasetState(*settled.dataset);
  PTC_RETURN_IF_ERROR(ptc::DescribeModel(settled.layout.spec(), settled.layout.config(), &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  PTC_ASSIGN_OR_RETURN(auto snap, ctx_.MakeSnapshot(std::move(settled.layout), settled.dataset));
  ctx_.Commit(snap);
  return ptc::Status::OK();
}

}  // namespace ptcfs
