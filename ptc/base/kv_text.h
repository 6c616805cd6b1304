// Parsing of the "key=value,key=value" text used for configs and model dims.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/base/status.h"

namespace ptc {

// Splits "a=1,b=2" into pairs, trimming spaces.
// \error InvalidArgument for an item without '=', an empty key or value, or a repeated key.
Result<std::vector<std::pair<std::string, std::string>>> SplitKeyValues(std::string_view text);
// A decimal integer > 0 that fits in int64.
Result<int64_t> ParsePositiveInt(std::string_view text);

}  // namespace ptc
