#include "ptc/model/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "ptc/base/kv_text.h"
#include "ptc/model/limits.h"

namespace ptc {

RankCoords ParallelConfig::CoordsOf(int rank) const {
  RankCoords c;
  const int stage = tp * cp * dp;  // ranks of one pipeline stage, in both grids
  const int s = rank % stage;
  c.pp = rank / stage;
  c.tp = s % tp;
  c.cp = (s / tp) % cp;
  c.dp = s / (tp * cp);
  const int etp_size = expert_tp();
  c.etp = s % etp_size;
  c.ep = (s / etp_size) % ep;
  c.edp = s / (etp_size * ep);
  return c;
}

std::vector<int> ParallelConfig::Workers() const {
  std::vector<int> out(static_cast<size_t>(num_workers()));
  for (int s = 0; s < num_workers(); ++s) out[static_cast<size_t>(s)] = WorkerOfSlot(s);
  return out;
}

void ParallelConfig::DropDefaultPlacement() {
  for (size_t s = 0; s < workers.size(); ++s) {
    if (workers[s] != static_cast<int>(s)) return;
  }
  workers.clear();
}

bool ParallelConfig::HoldsRanks(int worker) const {
  for (int s = 0; s < num_workers(); ++s) {
    if (WorkerOfSlot(s) == worker) return true;
  }
  return false;
}

std::vector<int> ParallelConfig::KeepersOfSlot(int slot) const {
  std::vector<int> out;
  const int slots = num_workers();
  for (int k = 0; k < std::min(replicas, slots); ++k) out.push_back(WorkerOfSlot((slot + k) % slots));
  return out;
}

namespace {

std::string PlusList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "+" : "") + std::to_string(v[i]);
  return s;
}

// "a+b+c": each at least `min` and at most 2^20.
Result<std::vector<int>> ParsePlusList(const std::string& value, int min) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= value.size()) {
    const size_t plus = value.find('+', pos);
    const std::string part = value.substr(pos, plus == std::string::npos ? std::string::npos : plus - pos);
    int n = -1;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || n < min || n > (1 << 20)) {
      return InvalidArgumentError("'" + part + "' is not an integer from " + std::to_string(min) + " to 2^20");
    }
    out.push_back(n);
    if (plus == std::string::npos) break;
    pos = plus + 1;
  }
  return out;
}

}  // namespace

std::string WorkersText(const ParallelConfig& config) {
  std::string s;
  for (int w : config.Workers()) s += (s.empty() ? "" : ", ") + std::to_string(w);
  return s;
}

Status CheckExpertGrid(const ParallelConfig& c) {
  const int64_t dense = int64_t{c.tp} * c.cp * c.dp, expert = int64_t{c.expert_tp()} * c.ep;
  if (dense % expert == 0) return Status::OK();
  return InvalidArgumentError("config " + c.ToString() + ": tp*cp*dp = " + std::to_string(dense) +
                              " is not a multiple of etp*ep = " + std::to_string(expert) +
                              " (each pipeline stage's ranks must form the expert grid etp x ep x edp)");
}

std::string ParallelConfig::ToString() const {
  std::string s = "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp);
  if (cp != 1) s += ",cp=" + std::to_string(cp);
  if (ep != 1) s += ",ep=" + std::to_string(ep);
  if (etp != 0) s += ",etp=" + std::to_string(etp);
  if (zero) s += ",zero=" + std::to_string(zero);
  if (!pp_layers.empty()) s += ",pp_layers=" + PlusList(pp_layers);
  s += ",per_worker=" + std::to_string(per_worker);
  if (!workers.empty()) s += ",workers=" + PlusList(workers);
  if (replicas != 1) s += ",replicas=" + std::to_string(replicas);
  return s;
}

Result<ParallelConfig> ParseConfig(std::string_view text) {
  // Every key has a default, so "" would mean tp=1,pp=1: a missing value, not a request.
  if (std::all_of(text.begin(), text.end(), [](char ch) { return std::isspace(static_cast<unsigned char>(ch)); })) {
    return InvalidArgumentError("empty config: give at least tp=N (e.g. tp=2,pp=1)");
  }
  ParallelConfig c;
  PTC_ASSIGN_OR_RETURN(auto pairs, SplitKeyValues(text), "config '" + std::string(text) + "'");
  for (const auto& [key, value] : pairs) {
    // The bindings by init-capture: clang before 16 cannot capture structured bindings.
    auto err = [&, &key = key, &value = value](std::string why) {
      return InvalidArgumentError("config '" + std::string(text) + "': " + key + "=" + value + ": " + why);
    };
    if (key == "pp_layers") {
      auto list = ParsePlusList(value, 1);
      if (!list.ok()) return err("each stage needs a positive layer count (at most 2^20)");
      c.pp_layers = std::move(*list);
      continue;
    }
    if (key == "workers") {
      auto list = ParsePlusList(value, 0);
      if (!list.ok()) return err("each slot needs a worker id from 0 to 2^20");
      c.workers = std::move(*list);
      continue;
    }
    int* field = key == "tp"           ? &c.tp
                 : key == "pp"         ? &c.pp
                 : key == "dp"         ? &c.dp
                 : key == "zero"       ? &c.zero
                 : key == "per_worker" ? &c.per_worker
                 : key == "replicas"   ? &c.replicas
                 : key == "cp"         ? &c.cp
                 : key == "ep"         ? &c.ep
                 : key == "etp"        ? &c.etp
                                       : nullptr;
    if (field == nullptr) {
      return InvalidArgumentError("config '" + std::string(text) + "': unknown key '" + key +
                                  "' (expected tp, pp, dp, cp, ep, etp, zero, pp_layers, per_worker, workers, replicas)");
    }
    if (key == "zero") {
      if (value != "0" && value != "1") return err("zero must be 0 or 1");
      *field = value == "1";
      continue;
    }
    auto n = ParsePositiveInt(value);
    if (!n.ok() || *n > (1 << 20)) return err("must be a positive integer");
    *field = static_cast<int>(*n);
  }
  if (!c.pp_layers.empty() && static_cast<int>(c.pp_layers.size()) != c.pp) {
    return InvalidArgumentError("config '" + std::string(text) + "': pp_layers lists " +
                                std::to_string(c.pp_layers.size()) + " stages but pp=" + std::to_string(c.pp));
  }
  if (const int64_t ranks = int64_t{c.tp} * c.pp * c.dp * c.cp; ranks > kMaxRanks) {
    return InvalidArgumentError("config '" + CutForMessage(text) + "': " + (c.cp == 1 ? "tp*pp*dp" : "tp*cp*pp*dp") +
                                " = " + std::to_string(ranks) + " ranks exceeds the limit of " +
                                std::to_string(kMaxRanks) + " ranks");
  }
  if (c.etp == c.tp) c.etp = 0;  // the default, written one way
  PTC_RETURN_IF_ERROR(CheckExpertGrid(c));
  if (!c.workers.empty()) {
    const std::string w = "config '" + std::string(text) + "': workers=" + PlusList(c.workers) + ": ";
    if (static_cast<int64_t>(c.workers.size()) != static_cast<int64_t>(c.num_workers())) {
      return InvalidArgumentError(w + "lists " + std::to_string(c.workers.size()) + " workers but the ranks fill " +
                                  std::to_string(c.num_workers()) + " (world size / per_worker, rounded up)");
    }
    std::vector<int> sorted = c.workers;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgumentError(w + "names a worker twice");
    }
    c.DropDefaultPlacement();
  }
  if (c.replicas > c.num_workers()) {
    return InvalidArgumentError("config '" + std::string(text) + "': replicas=" + std::to_string(c.replicas) +
                                " exceeds the " + std::to_string(c.num_workers()) + " workers holding ranks");
  }
  return c;
}

}  // namespace ptc
