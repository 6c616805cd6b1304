// DcpSaveWrite: a DCP save (dcp/, or megatron/'s torch_dist), alone or as a
// worker's part of a change of the job.
#include "fs/writes/dcp_save.h"

#include <map>

#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/store/model_spec.h"
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

// What the settled parts of a save in `dir` make of the manifest's `extra`
// (the store's before) and the data position: Adam's steps and the param
// groups from whichever workers' files hold them, the save's other entries
// and `save_name` in place of any before; a torch_dist save's iteration,
// args and data position.
ptc::Status SettleExtra(const ptc::dcp::DcpSource& source, const SettledDcpSave& settled, const std::string& dir,
                        const std::string& save_name, nlohmann::json* extra,
                        std::optional<ptc::DatasetState>* dataset) {
  std::optional<ptc::megatron::OptimizerMeta> optimizer;
  std::vector<ptc::dcp::CarriedEntry> entries;
  if (source.optimizer_part) {
    PTC_ASSIGN_OR_RETURN(optimizer, ptc::dcp::PartsOptimizer(*source.optimizer_part, settled.entries, dir));
    PTC_ASSIGN_OR_RETURN(entries, ptc::dcp::PartsEntries(*source.optimizer_part, settled.entries, dir));
  }
  ptc::dcp::SetSavedEntries(entries, save_name, extra);
  if (optimizer) {
    PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState megatron,
                         ptc::megatron::LoadMegatronState(*extra, "the store's manifest"));
    megatron.optimizer = std::move(*optimizer);
    (*extra)[std::string(ptc::megatron::kManifestKey)] = ptc::megatron::EncodeMegatronState(megatron);
  }
  if (settled.manifest_extra) {  // a torch_dist save: its iteration, args and data position
    *extra = *settled.manifest_extra;
    if (extra->contains("dataset")) {
      PTC_ASSIGN_OR_RETURN(*dataset,
                           ptc::DecodeDatasetState("the torch_dist save's data position", (*extra)["dataset"]));
    }
  }
  return ptc::Status::OK();
}

}  // namespace

std::string DcpSaveWrite::SaveName() const {
  return keys_ == ptc::dcp::Keys::kMegatronCore ? "" : dir_.substr(dir_.rfind('/') + 1);
}

ptc::Status DcpSaveWrite::Run(AgreedChange& change, const std::string& metadata,
                              const std::function<void()>& committed) {
  return change.alone() ? SaveWhole(committed) : SavePart(change, metadata, committed);
}

ptc::Status DcpSaveWrite::SaveWhole(const std::function<void()>& committed) {
  ptc::Store& store = ctx_.store();
  const ptc::ModelSpec& spec = current_->spec();
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                       ptc::dcp::OpenDcp(store.env(), dir_, spec.schema, spec.dims, current_->config(), keys_, names_));
  PTC_RETURN_IF_ERROR(CheckKeepsOptimizer(spec, source, dir_));
  // A dcp/ save keeps the data position; a torch_dist save commits its own.
  nlohmann::json extra = state_ != nullptr ? state_->extra : store.current().extra;
  std::optional<ptc::DatasetState> dataset = state_ != nullptr ? state_->dataset : current_->dataset();
  PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcp(&store, source, std::move(extra), SaveName()).status());
  PTC_ASSIGN_OR_RETURN(auto snap, ctx_.MakeSnapshot(source.layout, std::move(dataset)));
  if (committed) committed();
  ctx_.Commit(snap);
  return ptc::Status::OK();
}

ptc::Status DcpSaveWrite::SavePart(AgreedChange& change, const std::string& metadata,
                                   const std::function<void()>& committed) {
  ptc::Store& store = ctx_.store();
  const ptc::ModelSpec& spec = current_->spec();
  const bool torch_dist = keys_ == ptc::dcp::Keys::kMegatronCore;
  // This worker's part: the chunk files written here (none on a worker without ranks).
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::DcpSource source,
                       ptc::dcp::OpenDcpPart(store.env(), dir_, metadata, spec.schema, spec.dims, current_->config(),
                                             keys_, /*part=*/true, names_));
  PTC_RETURN_IF_ERROR(CheckKeepsOptimizer(spec, source, dir_));
  PTC_ASSIGN_OR_RETURN(auto writer, store.BeginGeneration());
  ptc::ImportResult written;
  PTC_RETURN_IF_ERROR(ptc::dcp::WriteDcpChunks(*writer, source, ctx_.worker(), &written));
  ptc::GenerationManifest meta;
  PTC_RETURN_IF_ERROR(ptc::DescribeModel(source.layout.spec(), source.layout.config(), &meta));
  std::vector<ptc::TensorRecord> tensors;
  if (!source.chunks.empty()) tensors = meta.tensors;
  auto settle = [&](const std::map<int, ptc::Part>& parts) -> ptc::Result<std::string> {
    PTC_ASSIGN_OR_RETURN(const SettledDcpSave settled, SettleDcpSave(source.all_files, torch_dist, parts));
    if (source.optimizer_part) {  // refused before a commit
      PTC_RETURN_IF_ERROR(ptc::dcp::PartsOptimizer(*source.optimizer_part, settled.entries, dir_).status());
      PTC_RETURN_IF_ERROR(ptc::dcp::PartsEntries(*source.optimizer_part, settled.entries, dir_).status());
    }
    return source.layout.config().ToString();
  };
  PTC_ASSIGN_OR_RETURN(
      const auto parts,
      change.BeforeSaveCommit(*writer, tensors,
                              DcpSavePartExtra(source.file_names, state_ ? &state_->extra : nullptr,
                                               source.optimizer_part ? source.optimizer_part->entries
                                                                     : std::vector<ptc::dcp::EntryBytes>{}),
                              settle));
  // Every worker settles the same files (the one that committed did so before it committed).
  PTC_ASSIGN_OR_RETURN(SettledDcpSave settled, SettleDcpSave(source.all_files, torch_dist, parts));
  std::optional<ptc::DatasetState> dataset = current_->dataset();
  meta.extra = store.current().extra;
  PTC_RETURN_IF_ERROR(SettleExtra(source, settled, dir_, SaveName(), &meta.extra, &dataset));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  PTC_ASSIGN_OR_RETURN(auto snap, ctx_.MakeSnapshot(source.layout, std::move(dataset)));
  if (committed) committed();
  ctx_.Commit(snap);
  return ptc::Status::OK();
}

}  // namespace ptcfs
