#include "ptc/base/json_fields.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace ptc {

std::string JsonText(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

bool IsNonNegativeInteger(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

std::string UnsignedProblem(const nlohmann::json& v) {
  if (IsNonNegativeInteger(v)) return "";
  if (v.is_number_float() && v.get<double>() >= 18446744073709551616.0)
    return "is out of range (at most " + std::to_string(UINT64_MAX) + ")";
  return "must be a non-negative integer";
}

nlohmann::json ParseJsonUniqueKeys(std::string_view text, std::string* duplicate) {
  using json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  bool found = false;
  json::parser_callback_t seen = [&](int, json::parse_event_t event, json& parsed) {
    if (found) return true;
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
      found = true;
      *duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), seen, /*allow_exceptions=*/false);
  return found ? json(json::value_t::discarded) : j;
}

Status JsonFields::Error(std::string_view key, std::string_view what) const {
  return CorruptionError(where_ + ": \"" + std::string(key) + "\" " + std::string(what));
}

const nlohmann::json* JsonFields::Find(std::string_view key) const {
  auto it = obj_.find(key);
  return it == obj_.end() ? nullptr : &*it;
}

Result<const nlohmann::json*> JsonFields::Get(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return Error(key, "is missing");
  return v;
}

Result<std::string> JsonFields::String(std::string_view key) const {
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_string()) return Error(key, "must be a string");
  return v->get<std::string>();
}

Result<uint64_t> JsonFields::Unsigned(std::string_view key) const {
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (const std::string problem = UnsignedProblem(*v); !problem.empty()) return Error(key, problem);
  return v->get<uint64_t>();
}

Result<const nlohmann::json*> JsonFields::Array(std::string_view key) const {
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_array()) return Error(key, "must be an array");
  return v;
}

}  // namespace ptc
