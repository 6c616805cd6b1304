// ptcfs inspect: what a store holds. `--json` output is documented in docs/cli.md.
#include <cstdio>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct InspectArgs {
  std::string store;
  bool json = false;
};

nlohmann::json Summary(const ptc::Store& store) {
  nlohmann::json j = {{"store", store.root()}, {"generation", nullptr}};
  if (!store.has_generation()) return j;
  const ptc::GenerationManifest& m = store.current();
  uint64_t tensor_bytes = 0, stored_bytes = 0;
  for (const ptc::TensorRecord& t : m.tensors) tensor_bytes += ptc::NumElements(t.shape) * ptc::DTypeSize(t.dtype);
  std::map<int, std::pair<uint64_t, uint64_t>> workers;  // worker -> (shards, bytes)
  std::map<std::string, uint64_t> files;
  for (const ptc::ShardRecord& s : m.shards) {
    workers[s.worker].first++;
    workers[s.worker].second += s.nbytes;
    files[s.file] += s.nbytes;
  }
  for (const auto& [file, bytes] : files) stored_bytes += bytes;
  j["generation"] = m.generation;
  j["parent"] = m.parent ? nlohmann::json(*m.parent) : nlohmann::json(nullptr);
  // A store that holds only a dataset has no schema (null) and no tensors.
  j["schema"] = m.schema.is_object() ? m.schema.value("name", "") : "";
  j["dataset"] = m.extra.is_object() && m.extra.contains("dataset");
  j["dims"] = m.dims;
  j["config"] = m.config;
  j["model"] = m.extra.is_object() ? m.extra.value("model", nlohmann::json::object()) : nlohmann::json::object();
  j["tensors"] = m.tensors.size();
  j["tensor_bytes"] = tensor_bytes;
  j["shards"] = m.shards.size();
  j["files"] = files.size();
  j["stored_bytes"] = stored_bytes;
  j["workers"] = nlohmann::json::array();
  for (const auto& [w, v] : workers) j["workers"].push_back({{"worker", w}, {"shards", v.first}, {"bytes", v.second}});
  return j;
}

ptc::Status RunInspect(const InspectArgs& a) {
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), a.store));
  nlohmann::json j = Summary(*store);
  if (a.json) {
    std::printf("%s\n", ptc::JsonText(j, 2).c_str());
    return ptc::Status::OK();
  }
  if (j["generation"].is_null()) {
    std::printf("store       %s\ngeneration  none (empty store)\n", a.store.c_str());
    return ptc::Status::OK();
  }
  std::printf("store       %s\n", a.store.c_str());
  std::printf("generation  %s (parent %s)\n", j["generation"].dump().c_str(), j["parent"].dump().c_str());
  if (j["tensors"].get<size_t>() == 0) {
    std::printf("tensors     none: %s: generation %s holds %s (import a checkpoint first)\n", a.store.c_str(),
                j["generation"].dump().c_str(), j["dataset"].get<bool>() ? "a dataset but no tensors" : "no tensors");
    return ptc::Status::OK();
  }
  std::printf("schema      %s\n", j["schema"].get<std::string>().c_str());
  std::printf("dims        %s\n", j["dims"].get<std::string>().c_str());
  std::printf("config      %s\n", j["config"].get<std::string>().c_str());
  std::printf("model       %s parameters%s\n", j["model"].value("dtype", "?").c_str(),
              j["model"].value("optimizer", false) ? ", Adam optimizer state (F32)" : ", no optimizer state");
  std::printf("tensors     %zu global, %s\n", j["tensors"].get<size_t>(), HumanBytes(j["tensor_bytes"]).c_str());
  std::printf("stored      %zu shards in %zu files, %s\n", j["shards"].get<size_t>(), j["files"].get<size_t>(),
              HumanBytes(j["stored_bytes"]).c_str());
  for (const auto& w : j["workers"]) {
    std::printf("  worker %-4d %zu shards, %s\n", w["worker"].get<int>(), w["shards"].get<size_t>(),
                HumanBytes(w["bytes"]).c_str());
  }
  return ptc::Status::OK();
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* sub =
      app.add_subcommand("inspect", "Show what a store holds: generation, model, config, shards per worker.");
  sub->add_flag("--json", a->json, "machine-readable output (fields documented in docs/cli.md)");
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->callback([a, exit_code] { *exit_code = Report("inspect", RunInspect(*a)); });
}

}  // namespace ptcfs
