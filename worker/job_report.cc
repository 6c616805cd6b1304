#include "worker/job_report.h"

#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "cluster/durable.h"
#include "cluster/recovery.h"
#include "transform/plan.h"

namespace ptcfs::worker {

namespace {

// A piece's (tensor, boxes), by reference into a manifest.
using PieceKey = std::pair<std::string_view, const std::vector<ptc::Box>*>;
struct PieceKeyLess {
  bool operator()(const PieceKey& a, const PieceKey& b) const {
    return std::tie(a.first, *a.second) < std::tie(b.first, *b.second);
  }
};

}  // namespace

std::map<int, WorkerPieces> PiecesByWorker(const ptc::GenerationManifest& m) {
  std::map<PieceKey, std::set<int>, PieceKeyLess> holders;
  for (const ptc::ShardRecord& s : m.shards) holders[{s.tensor, &s.boxes}].insert(s.worker);
  std::map<int, WorkerPieces> out;
  for (const ptc::ShardRecord& s : m.shards) {
    WorkerPieces& p = out[s.worker];
    p.pieces++;
    p.bytes += s.nbytes;
    for (int other : holders.at({s.tensor, &s.boxes})) {
      if (other != s.worker) p.copies[other] += s.nbytes;
    }
  }
  return out;
}

nlohmann::json PiecesJson(const WorkerPieces& p) {
  nlohmann::json copies = nlohmann::json::object();
  for (const auto& [other, bytes] : p.copies) copies[std::to_string(other)] = bytes;
  return {{"pieces", p.pieces}, {"bytes", p.bytes}, {"replicas", copies}};
}

nlohmann::json IfLost(const ptc::GenerationManifest& m, const ptc::ModelSpec& spec, const ptc::ParallelConfig& config,
                      const std::vector<int>& live, int worker, const std::vector<ptc::ShardRecord>* durable) {
  if (!config.HoldsRanks(worker)) return {{"holds_ranks", false}};
  std::set<int> survivors(live.begin(), live.end());
  survivors.erase(worker);
  nlohmann::json j = {{"holds_ranks", true}};
  auto to = ptc::cluster::SurvivorConfig(spec, config, std::vector<int>(survivors.begin(), survivors.end()));
  if (!to.ok()) {
    j["error"] = to.status().message();
    return j;
  }
  j["config"] = to->ToString();
  auto plan = ptc::transform::MakePlan({&m, spec, *to, {}, survivors});
  if (!plan.ok()) {
    j["error"] = plan.status().message();
    return j;
  }
  std::set<std::string> lost;
  for (const auto& [tensor, box] : plan->missing) lost.insert(tensor);
  j["lost_tensors"] = lost;
  if (!lost.empty() && durable != nullptr) {
    ptc::GenerationManifest widened = m;
    widened.shards.insert(widened.shards.end(), durable->begin(), durable->end());
    survivors.insert(ptc::cluster::kDurableWorker);
    auto restored = ptc::transform::MakePlan({&widened, spec, *to, {}, survivors, {ptc::cluster::kDurableWorker}});
    if (restored.ok() && restored->missing.empty()) {
      uint64_t from_durable = 0;
      for (const auto& [link, bytes] : restored->messages)
        from_durable += link.first == ptc::cluster::kDurableWorker ? bytes : 0;
      j["from_durable"] = from_durable;
      plan = std::move(restored);
    }
  }
  j["bytes_moved"] = plan->bytes_moved;
  j["lower_bound"] = plan->lower_bound;
  return j;
}

}  // namespace ptcfs::worker
