#include "cluster/job_state.h"

#include <algorithm>
#include <tuple>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ptc/base/checksum.h"
#include "ptc/base/json_fields.h"

namespace ptc::cluster {
namespace {

Result<nlohmann::json> ParseObject(std::string_view where, std::string_view value) {
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptionError(std::string(where) + ": not a JSON object");
  return j;
}

}  // namespace

std::string EncodeCommitted(const Committed& c) {
  return nlohmann::json{{"generation", c.generation}, {"config", c.config}, {"digest", c.digest}, {"contents", c.contents}}
      .dump();
}

std::string EncodeChange(const Change& c) {
  return nlohmann::json{{"id", c.id},           {"from", c.from},       {"generation", c.generation},
                        {"request", c.request}, {"workers", c.workers}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string EncodeFailure(const Failure& f) {
  return nlohmann::json{{"id", f.id}, {"error", f.error}}.dump(-1, ' ', false,
                                                               nlohmann::json::error_handler_t::replace);
}

std::string EncodePart(std::string_view id, const Part& part, const std::vector<TensorRecord>& tensors) {
  GenerationManifest m;
  m.shards = part.shards;
  m.extra = part.extra;
  std::unordered_set<std::string_view> named;  // (a worker of a large job holds ~1k of ~100k tensors)
  for (const ShardRecord& s : m.shards) named.insert(s.tensor);
  for (const TensorRecord& t : tensors) {
    if (named.count(t.name)) m.tensors.push_back(t);
  }
  return nlohmann::json{{"id", std::string(id)}, {"part", nlohmann::json::parse(EncodeManifest(m))}}.dump();
}

PartValues CutPart(std::string_view id, std::string encoded, size_t max_value) {
  PartValues out;
  if (encoded.size() <= max_value) {
    out.head = std::move(encoded);
    return out;
  }
  for (size_t at = 0; at < encoded.size(); at += max_value) out.chunks.push_back(encoded.substr(at, max_value));
  out.head = nlohmann::json{{"id", std::string(id)},
                            {"chunks", out.chunks.size()},
                            {"bytes", encoded.size()},
                            {"digest", ChecksumToString(Xxh64(encoded.data(), encoded.size()))}}
                 .dump();
  return out;
}

Result<Committed> DecodeCommitted(std::string_view where, std::string_view value) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(where, value));
  JsonFields f(j, std::string(where));
  Committed c;
  PTC_ASSIGN_OR_RETURN(c.generation, f.Unsigned("generation"));
  PTC_ASSIGN_OR_RETURN(c.config, f.String("config"));
  PTC_ASSIGN_OR_RETURN(c.digest, f.String("digest"));
  c.contents = c.digest;  // absent (a record written before contents were kept): its own digest
  if (f.Find("contents") != nullptr) {
    PTC_ASSIGN_OR_RETURN(c.contents, f.String("contents"));
  }
  return c;
}

Result<Change> DecodeChange(std::string_view where, std::string_view value) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(where, value));
  JsonFields f(j, std::string(where));
  Change c;
  PTC_ASSIGN_OR_RETURN(c.id, f.String("id"));
  PTC_ASSIGN_OR_RETURN(c.from, f.Unsigned("from"));
  PTC_ASSIGN_OR_RETURN(c.generation, f.Unsigned("generation"));
  if (c.generation != c.from + 1) return f.Error("generation", "is not from + 1");
  PTC_ASSIGN_OR_RETURN(c.request, f.String("request"));
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* workers, f.Array("workers"));
  for (const nlohmann::json& w : *workers) {
    if (!w.is_number_unsigned() || w.get<uint64_t>() > (1u << 20)) return f.Error("workers", "holds a non-worker");
    c.workers.push_back(w.get<int>());
  }
  if (!std::is_sorted(c.workers.begin(), c.workers.end()) ||
      std::adjacent_find(c.workers.begin(), c.workers.end()) != c.workers.end()) {
    return f.Error("workers", "is not sorted without repeats");
  }
  return c;
}

Result<Failure> DecodeFailure(std::string_view where, std::string_view value) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(where, value));
  JsonFields f(j, std::string(where));
  Failure out;
  PTC_ASSIGN_OR_RETURN(out.id, f.String("id"));
  PTC_ASSIGN_OR_RETURN(out.error, f.String("error"));
  return out;
}

Result<std::pair<std::string, Part>> DecodePart(std::string_view where, std::string_view value) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(where, value));
  JsonFields f(j, std::string(where));
  PTC_ASSIGN_OR_RETURN(std::string id, f.String("id"));
  PTC_ASSIGN_OR_RETURN(const nlohmann::json* part, f.Get("part"));
  PTC_ASSIGN_OR_RETURN(GenerationManifest m, DecodeManifest(std::string(where) + ": part", part->dump()));
  return std::make_pair(std::move(id), Part{std::move(m.shards), std::move(m.extra)});
}

Result<std::pair<std::string, Part>> DecodePart(std::string_view where, std::string_view head,
                                                const std::map<size_t, std::string>& chunks) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(where, head));
  if (!j.contains("chunks")) return DecodePart(where, head);
  JsonFields f(j, std::string(where));
  PTC_ASSIGN_OR_RETURN(std::string id, f.String("id"));
  PTC_ASSIGN_OR_RETURN(uint64_t count, f.Unsigned("chunks"));
  PTC_ASSIGN_OR_RETURN(uint64_t bytes, f.Unsigned("bytes"));
  PTC_ASSIGN_OR_RETURN(std::string digest, f.String("digest"));
  std::string joined;
  for (uint64_t i = 0; i < count; ++i) {
    auto it = chunks.find(i);
    if (it == chunks.end()) {
      return CorruptionError(std::string(where) + ": chunk " + std::to_string(i) + " of " + std::to_string(count) +
                             " is missing");
    }
    if (joined.size() + it->second.size() > bytes) break;
    joined += it->second;
  }
  if (joined.size() != bytes || ChecksumToString(Xxh64(joined.data(), joined.size())) != digest) {
    return CorruptionError(std::string(where) + ": its " + std::to_string(count) + " chunks are not the " +
                           std::to_string(bytes) + " bytes of digest " + digest + " it names");
  }
  PTC_ASSIGN_OR_RETURN(auto part, DecodePart(std::string(where) + " (joined)", joined));
  if (part.first != id) return CorruptionError(std::string(where) + ": its chunks are of change " + part.first);
  return part;
}

std::string PiecesDigest(std::string_view config, std::vector<ShardRecord> shards) {
  std::sort(shards.begin(), shards.end(), [](const ShardRecord& a, const ShardRecord& b) {
    return std::tie(a.tensor, a.worker, a.file, a.offset) < std::tie(b.tensor, b.worker, b.file, b.offset);
  });
  GenerationManifest m;
  m.config = config;
  m.shards = std::move(shards);
  const std::string text = EncodeManifest(m);
  return ChecksumToString(Xxh64(text.data(), text.size()));
}

}  // namespace ptc::cluster
