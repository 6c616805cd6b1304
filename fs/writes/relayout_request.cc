#include "fs/writes/relayout_request.h"

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"

namespace ptcfs {

ptc::Result<RelayoutRequest> ParseRelayoutRequest(const std::string& raw) {
  std::string text = raw;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.pop_back();
  RelayoutRequest r;
  if (!text.empty() && text.front() == '{') {
    const auto bad = ptc::InvalidArgumentError(
        ".ptcfs/config: expected a config such as tp=4,pp=1 or {\"config\": \"tp=4,pp=1\", \"step\": 100}");
    std::string duplicate;
    nlohmann::json j = ptc::ParseJsonUniqueKeys(text, &duplicate);
    if (!duplicate.empty())
      return ptc::InvalidArgumentError(".ptcfs/config: the field '" + ptc::Abbreviate(duplicate) + "' is given twice");
    if (j.is_discarded() || !j.is_object() || !j.contains("config") || !j["config"].is_string()) return bad;
    for (const auto& [key, value] : j.items()) {
      if (key == "config") continue;
      if (key != "step" && key != "epoch") {
        return ptc::InvalidArgumentError(".ptcfs/config: unknown field '" + ptc::Abbreviate(key) +
                                         "' (config, step, epoch)");
      }
      if (const std::string problem = ptc::UnsignedProblem(value); !problem.empty()) {
        return ptc::InvalidArgumentError(".ptcfs/config: '" + key + "' " + problem);
      }
      (key == "step" ? r.step : r.epoch) = value.get<uint64_t>();
    }
    if (r.epoch && !r.step) return ptc::InvalidArgumentError(".ptcfs/config: 'epoch' needs a 'step'");
    text = j["config"].get<std::string>();
  }
  PTC_ASSIGN_OR_RETURN(r.config, ptc::ParseConfig(text), ".ptcfs/config");
  return r;
}

}  // namespace ptcfs
