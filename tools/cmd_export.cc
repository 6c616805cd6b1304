// ptcfs export: the store's current generation in any parallel config.
#include <memory>
#include <optional>

#include "cluster/durable_transfer.h"
#include "cluster/s3/s3_config.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/store/model_spec.h"
#include "tools/commands.h"
#include "tools/path_check.h"
#include "tools/progress.h"
#include "view/export.h"
#include "view/hf_file.h"
#include "view/megatron_file.h"

namespace ptcfs {
namespace {

struct ExportArgs {
  std::string format = "safetensors", store, out;
  std::optional<std::string> config;      // --config: required but for dcp
  std::optional<std::string> names;       // --names, megatron only
  std::optional<std::string> shard_size;  // --shard-size, hf only
  std::optional<std::string> dcp_names;   // --dcp-names, dcp only
};

// Bytes of tensors in the Megatron files of `config` (data-parallel rank 0).
ptc::Result<uint64_t> MegatronBytes(const ptc::ModelLayout& layout) {
  const ptc::ParallelConfig& config = layout.config();
  uint64_t total = 0;
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, layout.View(rank));
    if (view.coords.dp != 0) continue;
    for (const auto* list : {&view.model, &view.optim}) {
      if (list == &view.optim && config.zero == 1) continue;
      for (const ptc::LocalTensor& t : *list) total += ptc::NumElements(t.shape) * ptc::DTypeSize(t.dtype);
    }
  }
  return total;
}

ptc::Status RunExportMegatron(const ExportArgs& a, const ptc::ParallelConfig& config) {
  ptc::Env* env = ptc::Env::Default();
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(env, a.store));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  auto generation = store->CurrentSnapshot();
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(*generation), a.store);
  PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), config));
  PTC_ASSIGN_OR_RETURN(const ptc::megatron::NameSet names, ptc::megatron::ParseNameSet(a.names.value_or("te")),
                       "--names");
  PTC_ASSIGN_OR_RETURN(uint64_t total, MegatronBytes(layout));
  Progress progress("export", total);
  return WriteFreshDirectory(
      env, a.out, [&] { return ExportMegatron(env, *store, generation, layout, a.out, names, progress.fn()); });
}

// A DCP checkpoint has no parallel config: any world size and sharding loads it.
ptc::Status RunExportDcp(const ExportArgs& a) {
  ptc::Env* env = ptc::Env::Default();
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(env, a.store));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  auto generation = store->CurrentSnapshot();
  uint64_t total = 0;
  for (const ptc::TensorRecord& t : generation->tensors) {
    total += static_cast<uint64_t>(ptc::NumElements(t.shape)) * ptc::DTypeSize(t.dtype);
  }
  Progress progress("export", total);
  const ptc::dcp::Keys keys =
      a.dcp_names.value_or("torch") == "torchtitan" ? ptc::dcp::Keys::kTorchtitan : ptc::dcp::Keys::kTorch;
  return WriteFreshDirectory(env, a.out,
                             [&] { return ExportDcp(env, *store, generation, a.out, progress.fn(), keys); });
}

// A Hugging Face model has no parallel config either; its optimizer state is not carried.
ptc::Status RunExportHf(const ExportArgs& a) {
  if (a.config || a.names) {
    return ptc::InvalidArgumentError(std::string(a.config ? "--config" : "--names") +
                                     ": a Hugging Face model has no parallel config or name set (docs/hf_format.md)");
  }
  uint64_t shard_bytes = ptc::hf::kDefaultShardBytes;
  if (a.shard_size) {
    PTC_ASSIGN_OR_RETURN(shard_bytes, ptc::hf::ParseShardSize(*a.shard_size), "--shard-size");
  }
  ptc::Env* env = ptc::Env::Default();
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(env, a.store));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  auto generation = store->CurrentSnapshot();
  PTC_ASSIGN_OR_RETURN(const ptc::hf::Plan plan, PlanHf(*generation, shard_bytes), a.store);
  uint64_t total = 0;
  for (const ptc::hf::Shard& s : plan.shards) total += s.bytes;
  Progress progress("export", total);
  return WriteFreshDirectory(env, a.out,
                             [&] { return ExportHf(env, *store, generation, a.out, shard_bytes, progress.fn()); });
}

// OUT an s3://BUCKET/PREFIX (or --format tier): the store's current
// generation in the durable tier's layout (cluster/durable_transfer.h).
ptc::Status RunExportTier(const ExportArgs& a) {
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), a.store));
  PTC_ASSIGN_OR_RETURN(ptc::cluster::DurableLocation tier, ptc::cluster::OpenDurableLocation(a.out), "OUT");
  PTC_ASSIGN_OR_RETURN(ptc::cluster::TransferStats stats, ptc::cluster::ExportToTier(ptc::Env::Default(), *store, tier));
  std::printf("exported generation %llu of %s to %s: %llu pieces, %s\n",
              static_cast<unsigned long long>(stats.generation), a.store.c_str(), tier.name.c_str(),
              static_cast<unsigned long long>(stats.pieces), HumanBytes(stats.bytes).c_str());
  return ptc::Status::OK();
}

ptc::Status RunExport(const ExportArgs& a) {
  if (ptc::cluster::s3::IsS3Url(a.out) || a.format == "tier") {
    if (a.config) return ptc::InvalidArgumentError("--config: an export to " + a.out + " keeps the store's layout");
    return RunExportTier(a);
  }
  PTC_RETURN_IF_ERROR(CheckOutsideStore(a.store, a.out));
  if (a.shard_size && a.format != "hf") {
    return ptc::InvalidArgumentError("--shard-size " + *a.shard_size + ": sizes the shards of --format hf only");
  }
  if (a.dcp_names && a.format != "dcp") {
    return ptc::InvalidArgumentError("--dcp-names " + *a.dcp_names + ": names the keys of --format dcp only");
  }
  if (a.format == "hf") return RunExportHf(a);
  if (a.format == "dcp") {
    if (a.config || a.names) {
      return ptc::InvalidArgumentError(std::string(a.config ? "--config" : "--names") +
                                       ": a DCP checkpoint has no parallel config or name set "
                                       "(any world size loads it; docs/dcp_format.md)");
    }
    return RunExportDcp(a);
  }
  if (!a.config) return ptc::InvalidArgumentError("--config is required for --format " + a.format);
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ParseConfig(*a.config));
  if (a.format == "megatron") return RunExportMegatron(a, config);
  if (a.names)
    return ptc::InvalidArgumentError("--names " + *a.names + ": names the tensors of --format megatron only");
  PTC_ASSIGN_OR_RETURN(ptc::CheckpointFormat format, ptc::ParseCheckpointFormat(a.format));
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), a.store));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(store->current()), a.store);
  PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), config));
  PTC_ASSIGN_OR_RETURN(uint64_t total, ptc::CheckpointBytes(layout));
  Progress progress("export", total);
  return ExportCheckpoint(*store, layout, a.out, format, progress.fn());
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* sub =
      app.add_subcommand("export",
                         "Write the store's current generation as a per-rank checkpoint of --config into OUT_DIR\n"
                         "(which must not exist or be empty). Any config that divides the model works: tensors\n"
                         "are cut from the stored shards, bit for bit, and every shard's checksum is verified.");
  sub->add_option("--config", a->config,
                  "target parallel config, e.g. tp=4,pp=2,dp=2,zero=1 (required but for --format dcp and hf)");
  sub->add_option("--format", a->format,
                  "safetensors: rank-RRRRR/model.safetensors (+ optim.safetensors); npy: "
                  "rank-RRRRR/tensors/<name>.npy with tensors/dtypes.json; megatron: Megatron-LM's\n"
                  "latest_checkpointed_iteration.txt + iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt\n"
                  "(torch.save files; docs/megatron_format.md); dcp: PyTorch Distributed Checkpoint,\n"
                  ".metadata + __W_0.distcp, loadable at any world size (docs/dcp_format.md); hf: the model\n"
                  "as Hugging Face's save_pretrained writes it, config.json + model-0000K-of-0000N.safetensors\n"
                  "+ model.safetensors.index.json (no optimizer state; docs/hf_format.md); tier: the store's\n"
                  "pieces as a cluster's durable tier holds them (durable.json written last; the default\n"
                  "when OUT_DIR is s3://BUCKET/PREFIX: keys from AWS_* or ~/.aws/credentials; docs/cluster.md)")
      ->check(CLI::IsMember({"safetensors", "npy", "megatron", "dcp", "hf", "tier"}));
  sub->add_option("--shard-size", a->shard_size,
                  "hf: the largest shard, as save_pretrained's max_shard_size: 5GB (default), 500MB, 2GiB, bytes");
  sub->add_option("--names", a->names, kMegatronNamesHelp)->check(CLI::IsMember({"te", "local"}));
  sub->add_option("--dcp-names", a->dcp_names, kDcpNamesHelp)->check(CLI::IsMember({"torch", "torchtitan"}));
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->add_option("OUT_DIR", a->out, "directory to write, or s3://BUCKET/PREFIX")->required();
  sub->callback([a, exit_code] { *exit_code = Report("export", RunExport(*a)); });
}

}  // namespace ptcfs
