// ptcfs import: a per-rank checkpoint into a store, as a new generation.
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/hf/read.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/megatron/import.h"
#include "cluster/durable_transfer.h"
#include "cluster/s3/s3_config.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct ImportArgs {
  std::string schema, dims, config, format = "safetensors", src, store;
  std::optional<uint64_t> iteration;
  bool wait = false;
};

ptc::Result<ptc::CheckpointSource> MegatronSource(ptc::Env* env, const ImportArgs& a, ptc::Schema schema,
                                                  ptc::ModelDims dims) {
  ptc::MegatronImportOptions o{a.src, std::move(schema), std::move(dims), a.iteration, std::nullopt};
  if (!a.config.empty()) {
    PTC_ASSIGN_OR_RETURN(o.config, ptc::ParseConfig(a.config));
  }
  return ptc::OpenMegatronCheckpoint(env, o);
}

// SRC an s3://BUCKET/PREFIX (or --format tier): a durable tier's copy
// (ptcfs export ... s3://, or a cluster's --durable) committed as the
// store's next generation, every byte checked (cluster/durable_transfer.h).
ptc::Status RunImportTier(const ImportArgs& a) {
  if (!a.schema.empty() || !a.dims.empty() || !a.config.empty() || a.iteration) {
    return ptc::InvalidArgumentError(a.src + ": a tier's copy names its model and layout (no --schema, --dims, "
                                     "--config or --iteration)");
  }
  PTC_ASSIGN_OR_RETURN(ptc::cluster::DurableLocation tier, ptc::cluster::OpenDurableLocation(a.src, false), "SRC");
  ptc::Env* env = ptc::Env::Default();
  const bool dir_existed = env->Exists(a.store);
  PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockStore(a.store, a.wait, /*create_dir=*/true));
  auto opened = ptc::Store::Open(env, a.store);
  if (!opened.ok() && opened.status().code() == ptc::Code::kNotFound) opened = ptc::Store::Create(env, a.store);
  ptc::Result<ptc::cluster::TransferStats> stats =
      opened.ok() ? ptc::cluster::ImportFromTier(tier, **opened) : ptc::Result<ptc::cluster::TransferStats>(opened.status());
  if (!stats.ok()) {
    opened = ptc::Status(ptc::Code::kInternal, "closed");  // the store closed before its directory goes
    if (!dir_existed) (void)env->RemoveTree(a.store);
    return stats.status();
  }
  std::printf("imported %s into %s: generation %llu, %llu shards, %s\n", tier.name.c_str(), a.store.c_str(),
              static_cast<unsigned long long>(stats->generation), static_cast<unsigned long long>(stats->pieces),
              HumanBytes(stats->bytes).c_str());
  return ptc::Status::OK();
}

ptc::Status RunImport(const ImportArgs& a) {
  if (ptc::cluster::s3::IsS3Url(a.src) || a.format == "tier") return RunImportTier(a);
  if (a.format == "hf") {
    // config.json says the model; the tensors become the stored pieces in --config (default tp=1).
    if (!a.schema.empty() || !a.dims.empty()) {
      return ptc::InvalidArgumentError(std::string(a.schema.empty() ? "--dims" : "--schema") +
                                       ": a Hugging Face model's config.json gives its schema and dims "
                                       "(docs/hf_format.md)");
    }
    if (a.iteration) return ptc::InvalidArgumentError("--iteration applies to --format megatron only");
  } else if (a.schema.empty() || a.dims.empty()) {
    return ptc::InvalidArgumentError(std::string(a.schema.empty() ? "--schema" : "--dims") +
                                     " is required for --format " + a.format);
  }
  ptc::Schema schema;
  ptc::ModelDims dims;
  if (a.format != "hf") {
    PTC_ASSIGN_OR_RETURN(schema, ptc::LoadSchema(a.schema));
    PTC_ASSIGN_OR_RETURN(dims, ptc::ParseDims(a.dims));
  }
  ptc::Env* env = ptc::Env::Default();
  ptc::CheckpointSource source;
  std::function<ptc::Result<ptc::ImportResult>(const ptc::ProgressFn&)> run_import = [&](const ptc::ProgressFn& p) {
    return ptc::ImportFrom(env, source, a.store, p);
  };
  if (a.format == "hf") {
    PTC_ASSIGN_OR_RETURN(source.config, ptc::ParseConfig(a.config.empty() ? "tp=1" : a.config));
    run_import = [&](const ptc::ProgressFn& p) { return ptc::hf::ImportHf(env, a.src, a.store, source.config, p); };
  } else if (a.format == "dcp") {
    // The chunks become the stored pieces, in --config (default tp=1,pp=1,dp=1: the mount
    // serves any layout from them and compacts in the background).
    if (a.iteration) return ptc::InvalidArgumentError("--iteration applies to --format megatron only");
    PTC_ASSIGN_OR_RETURN(source.config, ptc::ParseConfig(a.config.empty() ? "tp=1" : a.config));
    run_import = [&](const ptc::ProgressFn& p) {
      return ptc::dcp::ImportDcp(env, a.src, a.store, schema, dims, source.config, p);
    };
  } else if (a.format == "megatron") {
    PTC_ASSIGN_OR_RETURN(source, MegatronSource(env, a, std::move(schema), std::move(dims)));
  } else {
    if (a.config.empty()) return ptc::InvalidArgumentError("--config is required for --format " + a.format);
    if (a.iteration) return ptc::InvalidArgumentError("--iteration applies to --format megatron only");
    PTC_ASSIGN_OR_RETURN(source.config, ptc::ParseConfig(a.config));
    PTC_ASSIGN_OR_RETURN(source.spec, ptc::InferModelSpec(env, a.src, schema, dims));
    source.open_rank = [env, src = a.src](const ptc::RankView& view) {
      return ptc::RankCheckpoint::Open(env, src, view);
    };
    source.rank_file = [src = a.src](int rank) { return ptc::ModelFilePath(src, rank); };
  }
  uint64_t total = 0;  // unknown for dcp and hf (source.spec is empty)
  if (auto layout = ptc::ModelLayout::Make(source.spec, source.config); layout.ok()) {
    if (auto bytes = ptc::CheckpointBytes(*layout); bytes.ok()) total = *bytes;
  }
  // The writer lock before ImportFrom reads the root manifest (STORE is created when missing).
  const bool dir_existed = env->Exists(a.store);
  PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockStore(a.store, a.wait, /*create_dir=*/true));
  ptc::Result<ptc::ImportResult> imported = [&] {
    Progress progress("import", total);
    return run_import(progress.fn());
  }();
  if (!imported.ok()) {
    // A failed import leaves no directory it created (the lock file made one).
    ptc::Result<std::vector<std::string>> names = env->ListDir(a.store);
    if (!dir_existed && names.ok() && (names->empty() || *names == std::vector<std::string>{ptc::kStoreLockName})) {
      (void)env->RemoveTree(a.store);
    }
    return imported.status();
  }
  const ptc::ImportResult& result = *imported;
  std::printf("imported %s into %s: generation %llu, %llu shards, %s stored (%s read)\n", a.src.c_str(),
              a.store.c_str(), static_cast<unsigned long long>(result.generation),
              static_cast<unsigned long long>(result.shards), HumanBytes(result.bytes_stored).c_str(),
              HumanBytes(result.bytes_read).c_str());
  return ptc::Status::OK();
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* sub =
      app.add_subcommand("import",
                         "Import a per-rank checkpoint (SRC_DIR/rank-RRRRR/model.safetensors, + optim.safetensors)\n"
                         "written under --config into STORE as a new generation. Every file is checked against\n"
                         "the schema first (names, shapes, dtypes, replicas agreeing); on any error the store is\n"
                         "left exactly as it was. STORE is created when it does not exist. One writer at a time:\n"
                         "while a mount or another command writes STORE this fails naming it (--wait waits).");
  sub->footer(
      "--format megatron reads a Megatron-LM checkpoint tree instead: SRC_DIR holds\n"
      "latest_checkpointed_iteration.txt and iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt;\n"
      "tp and pp come from the directories (--config is optional, e.g. for uneven pp_layers),\n"
      "args, rng_state and the iteration are kept (docs/megatron_format.md). Examples:\n"
      "  ptcfs import --schema megatron-gpt --dims layers=24,hidden=1024,heads=16,vocab=32768,seq=2048 \\\n"
      "      --config tp=2,pp=2 ckpt/ store/\n"
      "  ptcfs import --format megatron --schema megatron-gpt --dims ... megatron_ckpt/ store/");
  sub->add_option("--schema", a->schema,
                  "built-in schema (megatron-gpt, llama) or schema JSON file (required but for --format hf)");
  sub->add_option("--dims", a->dims,
                  "model dims, e.g. layers=4,hidden=64,heads=4,vocab=1024,seq=128 (required but for --format hf)");
  sub->add_option("--config", a->config, "the parallel config the files were written in (megatron: optional)");
  sub->add_option("--format", a->format,
                  "format of the checkpoint: safetensors (rank files), megatron (Megatron-LM's tree), or dcp\n"
                  "(a PyTorch Distributed Checkpoint directory that dcp.save wrote: each chunk becomes a\n"
                  "stored piece; --config optional, default tp=1; docs/dcp_format.md), or hf (a model\n"
                  "Hugging Face's save_pretrained wrote: config.json gives the schema and dims, each tensor\n"
                  "becomes a stored piece; --config optional, default tp=1; docs/hf_format.md), or tier (a\n"
                  "durable tier's copy, as `ptcfs export STORE s3://...` or a cluster's --durable wrote it;\n"
                  "the default for SRC_DIR s3://BUCKET/PREFIX, keys from AWS_* or ~/.aws/credentials)")
      ->check(CLI::IsMember({"safetensors", "megatron", "dcp", "hf", "tier"}));
  sub->add_option("--iteration", a->iteration, "megatron: the iteration to import (default: the latest)");
  sub->add_option("SRC_DIR", a->src, "per-rank checkpoint directory, or s3://BUCKET/PREFIX")->required();
  sub->add_option("STORE", a->store, "store directory")->required();
  AddWaitFlag(sub, &a->wait);
  sub->callback([a, exit_code] { *exit_code = Report("import", RunImport(*a)); });
}

}  // namespace ptcfs
