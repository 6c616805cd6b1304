#include "ptc/base/kv_text.h"

#include <charconv>
#include <set>

namespace ptc {
namespace {

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> SplitKeyValues(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  size_t pos = 0;
  if (Trim(text).empty()) return out;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = Trim(text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos));
    size_t eq = item.find('=');
    if (eq == std::string::npos) return InvalidArgumentError("item '" + item + "' is not key=value");
    std::string key = Trim(std::string_view(item).substr(0, eq)), value = Trim(std::string_view(item).substr(eq + 1));
    if (key.empty() || value.empty()) return InvalidArgumentError("item '" + item + "' has an empty key or value");
    if (!seen.insert(key).second) return InvalidArgumentError("key '" + key + "' given twice");
    out.emplace_back(std::move(key), std::move(value));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

Result<int64_t> ParsePositiveInt(std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v <= 0) {
    return InvalidArgumentError("'" + std::string(text) + "' is not a positive integer");
  }
  return v;
}

}  // namespace ptc
