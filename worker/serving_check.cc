#include "worker/serving_check.h"

#include <map>

#include "ptc/model/box.h"
#include "ptc/store/model_spec.h"
#include "transform/plan.h"

namespace ptcfs::worker {
namespace {

// Every target shard of the config is covered by shards of its own worker.
void CheckCoverage(const ptc::GenerationManifest& m, const ptc::ModelLayout& layout,
                   std::vector<std::string>* problems) {
  auto targets = ptc::transform::TargetShardKeys(layout);
  if (!targets.ok()) {
    problems->push_back("config '" + m.config + "': " + targets.status().message());
    return;
  }
  std::map<std::pair<std::string, int>, std::vector<const ptc::Box*>> held;  // (tensor, worker) -> boxes
  for (const ptc::ShardRecord& s : m.shards) {
    for (const ptc::Box& b : s.boxes) held[{s.tensor, s.worker}].push_back(&b);
  }
  for (const auto& [key, worker] : *targets) {
    const auto it = held.find({key.tensor, worker});
    for (const ptc::Box& want : key.boxes) {
      std::vector<ptc::Box> missing = {want};
      if (it != held.end()) {
        for (const ptc::Box* have : it->second) {
          std::vector<ptc::Box> still;
          for (const ptc::Box& part : missing) {
            for (ptc::Box& rest : ptc::Subtract(part, *have)) still.push_back(std::move(rest));
          }
          missing = std::move(still);
        }
      }
      if (!missing.empty()) {
        problems->push_back("tensor '" + key.tensor + "': no shard on worker " + std::to_string(worker) + " holds " +
                            missing.front().ToString() + " (config " + m.config + " needs it there)");
      }
    }
  }
}

}  // namespace

std::vector<std::string> ServingProblems(const ptc::GenerationManifest& m) {
  std::vector<std::string> problems;
  if (m.tensors.empty() && m.schema.is_null()) return problems;  // a dataset only
  auto spec = ptc::ModelOfManifest(m);
  if (!spec.ok()) return {spec.status().message()};
  auto config = ptc::ConfigFromManifest(m);
  if (!config.ok()) return {config.status().message()};
  auto layout = ptc::ModelLayout::Make(*spec, *config);
  if (!layout.ok()) {
    return {"config '" + m.config + "' does not fit the model (dims '" + m.dims + "'): " + layout.status().message()};
  }
  auto globals = ptc::GlobalTensors(*spec);
  if (!globals.ok()) return {"dims '" + m.dims + "': " + globals.status().message()};
  problems = ptc::TensorTableProblems(m, *globals);
  if (problems.empty()) CheckCoverage(m, *layout, &problems);
  return problems;
}

}  // namespace ptcfs::worker
