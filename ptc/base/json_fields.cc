#include "ptc/base/json_fields.h"

namespace ptc {

std::string JsonText(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

bool IsNonNegativeInteger(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
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
  if (!IsNonNegativeInteger(*v)) return Error(key, "must be a non-negative integer");
  return v->get<uint64_t>();
}

Result<const nlohmann::json*> JsonFields::Array(std::string_view key) const {
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_array()) return Error(key, "must be an array");
  return v;
}

}  // namespace ptc
