// Bytes as lower-case hex text, as manifests and a cluster's parts carry
// small binary values (pickles, torch.save entries) in JSON.
#pragma once

#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc {

// Two lower-case hex digits per byte.
std::string Hex(std::string_view bytes);

// The inverse. `what` names the field in messages.
// \error InvalidArgument "WHAT: odd hex length", or "WHAT: not hex at N" for
//        a character that is not 0-9 or a-f.
Result<std::string> Unhex(std::string_view text, const std::string& what);

}  // namespace ptc
