#include "ptc/store/store_layout.h"

#include <cinttypes>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace ptc {
namespace {

constexpr std::string_view kRootFormat = "ptcfs-store";
constexpr int kRootVersion = 1;

}  // namespace

std::string EncodeRootManifest(uint64_t generation) {
  nlohmann::ordered_json j;
  j["format"] = kRootFormat;
  j["version"] = kRootVersion;
  j["generation"] = generation;
  return j.dump() + "\n";
}

Result<uint64_t> DecodeRootManifest(const std::string& label, std::string_view text) {
  using json = nlohmann::json;
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptionError(label + ": not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kRootFormat) {
    return CorruptionError(label + ": \"format\" must be \"ptcfs-store\"; not a ptcfs store");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_unsigned() || version->get<uint64_t>() != kRootVersion) {
    return CorruptionError(label + ": unsupported \"version\" (this build reads version 1)");
  }
  auto generation = j.find("generation");
  if (generation == j.end() || !generation->is_number()) {
    return CorruptionError(label + ": \"generation\" must be an integer from 0 to " + std::to_string(kMaxGeneration));
  }
  if (!generation->is_number_unsigned() || generation->get<uint64_t>() > kMaxGeneration) {
    return CorruptionError(label + ": \"generation\" " + Abbreviate(generation->dump(), 40) + " is out of range (0 to " +
                           std::to_string(kMaxGeneration) + ")");
  }
  return generation->get<uint64_t>();
}

std::string GenerationDirName(uint64_t g) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "gen-%06" PRIu64, g);
  return buf;
}

std::optional<uint64_t> ParseGenerationDirName(std::string_view name) {
  if (name.size() < 5 || name.substr(0, 4) != "gen-") return std::nullopt;
  uint64_t g = 0;
  for (char c : name.substr(4)) {
    if (c < '0' || c > '9') return std::nullopt;
    if (g > (UINT64_MAX - 9) / 10) {
      g = UINT64_MAX;  // saturates
    } else {
      g = g * 10 + static_cast<uint64_t>(c - '0');
    }
  }
  return g;
}

std::string WorkerDirName(int worker) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "worker-%02d", worker);
  return buf;
}

std::string SanitizeFileName(std::string_view tensor) {
  std::string out;
  for (char c : tensor.substr(0, 200)) {
    bool keep =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out.push_back(keep ? c : '_');
  }
  return out.empty() ? "_" : out;
}

}  // namespace ptc
