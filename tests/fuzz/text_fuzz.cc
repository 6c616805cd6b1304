// libFuzzer entry point for the text a user types or a store keeps: parallel
// configs, model dims, schemas and the JSON of a mount's .ptcfs/config. None may crash; what is accepted must
// round-trip through its canonical text.
// Run: ./text_fuzz -max_total_time=60 -max_len=1024 tests/fuzz/corpus/text_fuzz
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"
#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (auto config = ptc::ParseConfig(input); config.ok()) {
    auto again = ptc::ParseConfig(config->ToString());
    if (!again.ok() || !(*again == *config)) __builtin_trap();
  }
  if (auto dims = ptc::ParseDims(input); dims.ok()) {
    auto again = ptc::ParseDims(dims->ToString());
    if (!again.ok() || !(*again == *dims)) __builtin_trap();
  }
  const nlohmann::json doc = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) (void)ptc::ParseSchema("fuzz", doc);
  // .ptcfs/config's JSON: refused for a duplicate key, else what parse gives.
  std::string duplicate;
  const nlohmann::json strict = ptc::ParseJsonUniqueKeys(input, &duplicate);
  if (!duplicate.empty() && (doc.is_discarded() || !strict.is_discarded())) __builtin_trap();
  if (duplicate.empty() && strict.is_discarded() != doc.is_discarded()) __builtin_trap();
  if (!strict.is_discarded() && strict != doc) __builtin_trap();
  return 0;
}
