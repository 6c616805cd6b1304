// ptcfs export: the store's current generation in any parallel config.
#include <memory>

#include "ptc/export.h"
#include "ptc/model_spec.h"
#include "ptc/synth_checkpoint.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct ExportArgs {
  std::string config, format = "safetensors", store, out;
};

ptc::Status RunExport(const ExportArgs& a) {
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ParseConfig(a.config));
  PTC_ASSIGN_OR_RETURN(ptc::CheckpointFormat format, ptc::ParseCheckpointFormat(a.format));
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), a.store));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(store->current()));
  PTC_RETURN_IF_ERROR(ptc::ValidateConfig(spec, config));
  PTC_ASSIGN_OR_RETURN(uint64_t total, ptc::CheckpointBytes(spec, config));
  Progress progress("export", total);
  return ptc::ExportCheckpoint(*store, config, a.out, format, progress.fn());
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "Write the store's current generation as a per-rank checkpoint of --config into OUT_DIR\n"
      "(which must not exist or be empty). Any config that divides the model works: tensors\n"
      "are cut from the stored shards, bit for bit, and every shard's checksum is verified.");
  sub->add_option("--config", a->config, "target parallel config, e.g. tp=4,pp=2,dp=2,zero=1")->required();
  sub->add_option("--format", a->format,
                  "safetensors: rank-RRRRR/model.safetensors (+ optim.safetensors); npy: "
                  "rank-RRRRR/tensors/<name>.npy with tensors/dtypes.json")
      ->check(CLI::IsMember({"safetensors", "npy"}));
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->add_option("OUT_DIR", a->out, "directory to write")->required();
  sub->callback([a, exit_code] { *exit_code = Report("export", RunExport(*a)); });
}

}  // namespace ptcfs
