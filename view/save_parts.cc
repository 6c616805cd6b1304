#include "view/save_parts.h"

#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ptc/base/hex.h"
#include "ptc/model/dtype.h"

namespace ptcfs {
namespace {

// A part's "optimizer_entries" (DcpSavePartExtra's), appended to `out`.
ptc::Status DecodeEntries(const nlohmann::json& j, const std::string& what, std::vector<ptc::dcp::EntryBytes>* out) {
  const auto bad = [&] { return ptc::CorruptionError(what + ": its optimizer_entries are not DcpSavePartExtra's"); };
  if (!j.is_object() || !j.contains("blobs") || !j.contains("at") || !j["blobs"].is_array() || !j["at"].is_array()) {
    return bad();
  }
  std::vector<std::string> blobs;
  for (const nlohmann::json& b : j["blobs"]) {
    if (!b.is_string()) return bad();
    ptc::Result<std::string> bytes = ptc::Unhex(b.get<std::string>(), "a blob");
    if (!bytes.ok()) return bad();
    blobs.push_back(std::move(bytes).value());
  }
  for (const nlohmann::json& a : j["at"]) {
    if (!a.is_array() || a.size() != 4 || !a[0].is_string() || !a[1].is_number_unsigned() ||
        !a[2].is_number_unsigned() || !a[3].is_number_unsigned() || a[3].get<uint64_t>() >= blobs.size()) {
      return bad();
    }
    out->push_back(ptc::dcp::EntryBytes{a[0].get<std::string>(), a[1].get<uint64_t>(), a[2].get<uint64_t>(),
                                        blobs[a[3].get<size_t>()]});
  }
  return ptc::Status::OK();
}

// What one part says, checked.
struct PartSays {
  int tp = 0, pp = 0, ep = 1;
  ptc::DType dtype = ptc::DType::kF32;
  bool optimizer = false;
  std::vector<ptc::KeptRank> ranks;
};

ptc::Result<PartSays> ReadPart(int worker, uint64_t iteration, const nlohmann::json& extra) {
  const std::string what = "worker " + std::to_string(worker) + "'s part of the save";
  auto bad = [&](const std::string& why) { return ptc::CorruptionError(what + ": " + why); };
  const auto save = extra.find("save");
  if (save == extra.end() || !save->is_object()) return bad("no 'save' object");
  const auto it = save->find("iteration");
  if (it == save->end() || !it->is_number_unsigned() || it->get<uint64_t>() != iteration) {
    return bad("not of iteration " + std::to_string(iteration));
  }
  const auto ranks = save->find("ranks");
  if (ranks == save->end() || !ranks->is_array()) return bad("no 'ranks' array");
  PartSays says;
  if (ranks->empty()) return says;
  for (const char* key : {"tp", "pp"}) {
    const auto v = save->find(key);
    if (v == save->end() || !v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > 1 << 16) {
      return bad(std::string("'") + key + "' is no size");
    }
  }
  says.tp = save->at("tp").get<int>();
  says.pp = save->at("pp").get<int>();
  if (const auto ep = save->find("ep"); ep != save->end()) {
    if (!ep->is_number_unsigned() || ep->get<uint64_t>() < 1 || ep->get<uint64_t>() > 1 << 16) {
      return bad("'ep' is no size");
    }
    says.ep = ep->get<int>();
  }
  const auto dtype = save->find("dtype");
  const auto optimizer = save->find("optimizer");
  if (dtype == save->end() || !dtype->is_string()) return bad("no 'dtype'");
  if (optimizer == save->end() || !optimizer->is_boolean()) return bad("no 'optimizer'");
  auto parsed = ptc::ParseDType(dtype->get<std::string>());
  if (!parsed.ok()) return bad(parsed.status().message());
  says.dtype = *parsed;
  says.optimizer = optimizer->get<bool>();
  for (const nlohmann::json& r : *ranks) {
    PTC_ASSIGN_OR_RETURN(says.ranks.emplace_back(),
                         ptc::DecodeKeptRank(r, what + ": ranks[" + std::to_string(says.ranks.size()) + "]"));
  }
  return says;
}

std::string Describe(const PartSays& p) {
  return "tp=" + std::to_string(p.tp) + ", pp=" + std::to_string(p.pp) +
         (p.ep > 1 ? ", ep=" + std::to_string(p.ep) : std::string()) + ", " + std::string(ptc::DTypeName(p.dtype)) +
         (p.optimizer ? ", with optimizer state" : ", no optimizer state");
}

}  // namespace

// Megatron counts args.consumed_train_samples over the whole run, the global
// batch B per step and never reset at an epoch: T = consumed / B steps, so
// epoch T / S and step T % S of the store's epochs of S = ceil(N / B) steps
// (the end of an epoch is step 0 of the next).
ptc::Result<std::optional<ptc::DatasetState>> SavedDataPosition(const ptc::megatron::MegatronState& saved,
                                                                uint64_t iteration,
                                                                const std::optional<ptc::DatasetState>& current) {
  const std::string what = "the saved state dict";
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

ptc::Status CheckSavable(const ptc::ParallelConfig& config) {
  PTC_RETURN_IF_ERROR(ptc::megatron::CheckLegacySave(config));
  if (config.zero != 1) return ptc::Status::OK();
  return ptc::InvalidArgumentError(
      "saves through megatron/ need zero=0: Megatron's model_optim_rng.pt does not hold ZeRO-1 optimizer state");
}

ptc::ParallelConfig WithGrid(ptc::ParallelConfig config, int tp, int pp, int ep) {
  if (pp != config.pp) config.pp_layers.clear();
  config.tp = tp;
  config.pp = pp;
  config.ep = ep;
  return config;
}

nlohmann::json SavePartExtra(uint64_t iteration, const ptc::MegatronSavePart& part) {
  nlohmann::json save = {{"iteration", iteration}, {"ranks", nlohmann::json::array()}};
  if (!part.kept.empty()) {
    save["tp"] = static_cast<uint64_t>(part.source.config.tp);
    save["pp"] = static_cast<uint64_t>(part.source.config.pp);
    if (part.source.config.ep > 1) save["ep"] = static_cast<uint64_t>(part.source.config.ep);
    save["dtype"] = std::string(ptc::DTypeName(part.source.spec.dtype));
    save["optimizer"] = part.source.spec.optimizer;
    for (const ptc::KeptRank& k : part.kept) save["ranks"].push_back(ptc::EncodeKeptRank(k));
  }
  return {{"save", std::move(save)}};
}

ptc::Result<SettledSave> SettleSave(uint64_t iteration, const ptc::ModelSpec& current_spec,
                                    const ptc::ParallelConfig& current, const std::optional<ptc::DatasetState>& dataset,
                                    const std::map<int, ptc::Part>& parts) {
  std::map<int, PartSays> says;
  int first = -1;  // the first worker with rank files: the grid, dtype and optimizer state every other must have
  for (const auto& [worker, part] : parts) {
    PTC_ASSIGN_OR_RETURN(PartSays s, ReadPart(worker, iteration, part.extra));
    if (!s.ranks.empty()) {
      if (first < 0) {
        first = worker;
      } else if (std::tie(s.tp, s.pp, s.ep, s.dtype, s.optimizer) !=
                 std::tie(says[first].tp, says[first].pp, says[first].ep, says[first].dtype, says[first].optimizer)) {
        return ptc::InvalidArgumentError("the rank files of iteration " + std::to_string(iteration) + " on worker " +
                                         std::to_string(first) + " say " + Describe(says[first]) + ", on worker " +
                                         std::to_string(worker) + " " + Describe(s));
      }
    }
    says[worker] = std::move(s);
  }
  const std::string iter_dir = "megatron/" + ptc::megatron::IterationDirName(iteration);
  if (first < 0) {
    return ptc::InvalidArgumentError("no worker holds a rank file of the save: " + iter_dir +
                                     "/mp_rank_*/model_optim_rng.pt was written on none");
  }
  const PartSays& grid = says[first];
  // Each rank file once (the lowest worker's, when two hold one: its pieces there are replicas).
  std::map<std::tuple<int, int, int>, int> holder;
  std::vector<ptc::KeptRank> ranks;
  for (auto& [worker, s] : says) {
    for (ptc::KeptRank& k : s.ranks) {
      if (!holder.emplace(std::make_tuple(k.tp, k.pp, k.ep), worker).second) continue;
      ranks.push_back(std::move(k));
    }
  }
  for (int pp = 0; pp < grid.pp; ++pp) {
    for (int ep = 0; ep < grid.ep; ++ep) {
      for (int tp = 0; tp < grid.tp; ++tp) {
        if (holder.count({tp, pp, ep}) == 0) {
          return ptc::InvalidArgumentError(iter_dir + "/" + ptc::megatron::RankDirName(tp, pp, grid.pp, ep, grid.ep) +
                                           "/" + std::string(ptc::megatron::kRankFile) +
                                           ": written on no worker (the save's grid is " + Describe(grid) + ")");
        }
      }
    }
  }
  // Replicas of a piece written on two workers hold the same bytes.
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, int>> pieces;
  for (const auto& [worker, part] : parts) {
    for (const ptc::ShardRecord& s : part.shards) {
      std::string boxes;
      for (const ptc::Box& b : s.boxes) boxes += b.ToString() + " ";
      auto [it, added] = pieces.try_emplace({s.tensor, boxes}, s.checksum, worker);
      if (!added && it->second.first != s.checksum) {
        return ptc::InvalidArgumentError("replicas disagree: tensor '" + s.tensor + "' " + boxes + "differs between " +
                                         "the rank files on worker " + std::to_string(it->second.second) +
                                         " and on worker " + std::to_string(worker));
      }
    }
  }
  PTC_ASSIGN_OR_RETURN(
      ptc::ModelLayout layout,
      ptc::ModelLayout::Make(ptc::ModelSpec{current_spec.schema, current_spec.dims, grid.dtype, grid.optimizer},
                             WithGrid(current, grid.tp, grid.pp, grid.ep)));
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state,
                       ptc::FoldRanks(iteration, grid.tp, grid.pp, std::move(ranks), grid.ep));
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> position, SavedDataPosition(state, iteration, dataset));
  return SettledSave{std::move(layout), std::move(state), std::move(position)};
}

nlohmann::json DcpSavePartExtra(const std::vector<std::string>& files, const nlohmann::json* manifest_extra,
                                const std::vector<ptc::dcp::EntryBytes>& entries) {
  nlohmann::json dcp = {{"files", files}};
  if (manifest_extra != nullptr) dcp["manifest_extra"] = *manifest_extra;
  if (!entries.empty()) {
    // Steps are mostly alike: each distinct entry's bytes once.
    std::map<std::string, size_t> blob_of;
    nlohmann::json blobs = nlohmann::json::array(), at = nlohmann::json::array();
    for (const ptc::dcp::EntryBytes& e : entries) {
      auto [it, inserted] = blob_of.try_emplace(e.bytes, blobs.size());
      if (inserted) blobs.push_back(ptc::Hex(e.bytes));
      at.push_back({e.file, e.file_size, e.offset, it->second});
    }
    dcp["optimizer_entries"] = {{"blobs", std::move(blobs)}, {"at", std::move(at)}};
  }
  return {{"dcp", std::move(dcp)}};
}

ptc::Result<SettledDcpSave> SettleDcpSave(const std::set<std::string>& files, bool torch_dist,
                                          const std::map<int, ptc::Part>& parts) {
  std::map<std::string, int> holder;  // file -> worker
  std::optional<nlohmann::json> extra;
  SettledDcpSave settled;
  for (const auto& [worker, part] : parts) {
    const std::string what = "worker " + std::to_string(worker) + "'s part of the DCP save";
    const auto dcp = part.extra.find("dcp");
    if (dcp == part.extra.end() || !dcp->is_object() || !dcp->contains("files") || !(*dcp)["files"].is_array()) {
      return ptc::CorruptionError(what + ": no 'dcp' object with a 'files' array");
    }
    if (auto e = dcp->find("manifest_extra"); e != dcp->end()) {
      if (!e->is_object() || extra)
        return ptc::CorruptionError(what + ": a second manifest extra, or one that is no object");
      extra = *e;
    }
    if (auto e = dcp->find("optimizer_entries"); e != dcp->end()) {
      PTC_RETURN_IF_ERROR(DecodeEntries(*e, what, &settled.entries));
    }
    for (const nlohmann::json& f : (*dcp)["files"]) {
      if (!f.is_string()) return ptc::CorruptionError(what + ": a file that is no string");
      const std::string name = f.get<std::string>();
      if (!files.count(name))
        return ptc::CorruptionError(what + ": holds " + name + ", which the metadata does not name");
      auto [it, first] = holder.emplace(name, worker);
      if (!first) {
        return ptc::InvalidArgumentError("chunk file " + name + " was written on worker " + std::to_string(it->second) +
                                         " and on worker " + std::to_string(worker) +
                                         ": each rank's files go through the mount of the worker it runs on");
      }
    }
  }
  for (const std::string& f : files) {
    if (!holder.count(f)) {
      return ptc::InvalidArgumentError("chunk file " + f +
                                       " of the save's .metadata was written on no worker of the job");
    }
  }
  if (torch_dist && !extra) return ptc::CorruptionError("no part of the torch_dist save carries its common.pt's state");
  settled.manifest_extra = std::move(extra);
  return settled;
}

}  // namespace ptcfs
