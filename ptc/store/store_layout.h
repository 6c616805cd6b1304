// The names inside a store directory and the root manifest's text
// (docs/store_format.md), shared by the Store and the GenerationWriter.
//
//   STORE/manifest.json                      the root manifest: EncodeRootManifest
//   STORE/gen-NNNNNN/                        GenerationDirName
//   STORE/gen-NNNNNN/worker-WW/<stem>.sK.h5  WorkerDirName, SanitizeFileName
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc {

// The root manifest's and every generation manifest's file name.
inline constexpr std::string_view kManifestName = "manifest.json";

// The root manifest naming `generation` (0: none yet), one line of JSON.
std::string EncodeRootManifest(uint64_t generation);

// The generation a root manifest names (0: none). `label` starts every error.
// \error Corruption when the text is not a ptcfs-store manifest of version 1
//        with a "generation" from 0 to kMaxGeneration.
Result<uint64_t> DecodeRootManifest(const std::string& label, std::string_view text);

// The largest generation number: what every JSON reader holds exactly (2^53-1).
inline constexpr uint64_t kMaxGeneration = (uint64_t{1} << 53) - 1;

// "gen-000007".
std::string GenerationDirName(uint64_t g);
// Parses "gen-000007" -> 7; nullopt for any other name. A number above
// UINT64_MAX parses as UINT64_MAX (a generation directory all the same, and
// above kMaxGeneration).
std::optional<uint64_t> ParseGenerationDirName(std::string_view name);

// "worker-03".
std::string WorkerDirName(int worker);

// Keeps [A-Za-z0-9._-], replaces other bytes with '_', truncates to 200 chars.
std::string SanitizeFileName(std::string_view tensor);

}  // namespace ptc
