// Typed access to the members of one JSON object, for the decoders of our
// JSON records (the generation manifest, the dataset state). Never throws:
// every access checks the type first. Every error is Corruption and reads
//   WHERE: "KEY" WHAT        e.g.  gen-000003/manifest.json: shard 7 (tensor 'w'): "offset" is missing
//
// Thread safety: a JsonFields is a read-only view; its object must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"

namespace ptc {

// The JSON text of `j` (`indent` as nlohmann's dump). Never throws: strings
// that are not valid UTF-8 (a path or config typed by a user) have their bad
// bytes replaced by U+FFFD instead of ending the process.
std::string JsonText(const nlohmann::json& j, int indent = -1);

// True for an integer >= 0. Parsed text holds those as unsigned numbers; a json
// built in code may hold them as signed ones.
bool IsNonNegativeInteger(const nlohmann::json& v);
// Why `v` is not an unsigned 64-bit integer ("" when it is): "must be a
// non-negative integer", or "is out of range (at most 18446744073709551615)"
// for a whole number above it (which JSON parsers hold as a float).
std::string UnsignedProblem(const nlohmann::json& v);

// nlohmann::json::parse without exceptions that also refuses an object with a
// key twice (parse keeps the last): discarded when the text is not JSON or
// holds a duplicate key, which is then in `*duplicate`. Linear in the text.
nlohmann::json ParseJsonUniqueKeys(std::string_view text, std::string* duplicate);

class JsonFields {
 public:
  JsonFields(const nlohmann::json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // Corruption: `WHERE: "KEY" WHAT`.
  Status Error(std::string_view key, std::string_view what) const;
  // The member, or nullptr when absent.
  const nlohmann::json* Find(std::string_view key) const;
  // \error Corruption `"KEY" is missing`.
  Result<const nlohmann::json*> Get(std::string_view key) const;
  // \error as Get; Corruption `"KEY" must be a string`.
  Result<std::string> String(std::string_view key) const;
  // \error as Get; Corruption `"KEY" ` + UnsignedProblem.
  Result<uint64_t> Unsigned(std::string_view key) const;
  // \error as Get; Corruption `"KEY" must be an array`.
  Result<const nlohmann::json*> Array(std::string_view key) const;

 private:
  const nlohmann::json& obj_;
  std::string where_;
};

}  // namespace ptc
