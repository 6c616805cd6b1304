#include "ptc/model/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "ptc/base/kv_text.h"

namespace ptc {

RankCoords ParallelConfig::CoordsOf(int rank) const {
  RankCoords c;
  c.tp = rank % tp;
  c.dp = (rank / tp) % dp;
  c.pp = rank / (tp * dp);
  return c;
}

std::string ParallelConfig::ToString() const {
  std::string s = "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp);
  if (zero) s += ",zero=" + std::to_string(zero);
  if (!pp_layers.empty()) {
    s += ",pp_layers=";
    for (size_t i = 0; i < pp_layers.size(); ++i) s += (i ? "+" : "") + std::to_string(pp_layers[i]);
  }
  s += ",per_worker=" + std::to_string(per_worker);
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
      c.pp_layers.clear();
      size_t pos = 0;
      while (pos <= value.size()) {
        size_t plus = value.find('+', pos);
        std::string part = value.substr(pos, plus == std::string::npos ? std::string::npos : plus - pos);
        auto n = ParsePositiveInt(part);
        if (!n.ok() || *n > (1 << 20)) return err("each stage needs a positive layer count (at most 2^20)");
        c.pp_layers.push_back(static_cast<int>(*n));
        if (plus == std::string::npos) break;
        pos = plus + 1;
      }
      continue;
    }
    int* field = key == "tp"           ? &c.tp
                 : key == "pp"         ? &c.pp
                 : key == "dp"         ? &c.dp
                 : key == "zero"       ? &c.zero
                 : key == "per_worker" ? &c.per_worker
                                       : nullptr;
    if (field == nullptr) {
      return InvalidArgumentError("config '" + std::string(text) + "': unknown key '" + key +
                                  "' (expected tp, pp, dp, zero, pp_layers, per_worker)");
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
  return c;
}

}  // namespace ptc
