// ptcfs import: a per-rank checkpoint into a store, as a new generation.
#include <cstdio>
#include <memory>

#include "ptc/import.h"
#include "ptc/synth_checkpoint.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct ImportArgs {
  std::string schema, dims, config, format = "safetensors", src, store;
};

ptc::Status RunImport(const ImportArgs& a) {
  PTC_ASSIGN_OR_RETURN(ptc::Schema schema, ptc::LoadSchema(a.schema));
  PTC_ASSIGN_OR_RETURN(ptc::ModelDims dims, ptc::ParseDims(a.dims));
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ParseConfig(a.config));
  ptc::Env* env = ptc::Env::Default();
  uint64_t total = 0;
  if (auto spec = ptc::InferModelSpec(env, a.src, schema, dims); spec.ok()) {
    if (auto bytes = ptc::CheckpointBytes(*spec, config); bytes.ok()) total = *bytes;
  }
  ptc::ImportResult result;
  {
    Progress progress("import", total);
    PTC_ASSIGN_OR_RETURN(result, ptc::ImportCheckpoint(env, a.src, a.store, schema, dims, config, progress.fn()));
  }
  std::printf("imported %s into %s: generation %llu, %llu shards, %s stored (%s read)\n", a.src.c_str(),
              a.store.c_str(), static_cast<unsigned long long>(result.generation),
              static_cast<unsigned long long>(result.shards), HumanBytes(result.bytes_stored).c_str(),
              HumanBytes(result.bytes_read).c_str());
  return ptc::Status::OK();
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* sub = app.add_subcommand(
      "import",
      "Import a per-rank checkpoint (SRC_DIR/rank-RRRRR/model.safetensors, + optim.safetensors)\n"
      "written under --config into STORE as a new generation. Every file is checked against\n"
      "the schema first (names, shapes, dtypes, replicas agreeing); on any error the store is\n"
      "left exactly as it was. STORE is created when it does not exist.");
  sub->add_option("--schema", a->schema, "built-in schema (megatron-gpt, llama) or schema JSON file")->required();
  sub->add_option("--dims", a->dims, "model dims, e.g. layers=4,hidden=64,heads=4,vocab=1024,seq=128")->required();
  sub->add_option("--config", a->config, "the parallel config the files were written in")->required();
  sub->add_option("--format", a->format, "format of the rank files")->check(CLI::IsMember({"safetensors"}));
  sub->add_option("SRC_DIR", a->src, "per-rank checkpoint directory")->required();
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->callback([a, exit_code] { *exit_code = Report("import", RunImport(*a)); });
}

}  // namespace ptcfs
