// Base64 (RFC 4648, standard alphabet, padded): how etcd's JSON gateway
// carries keys and values.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc::cluster {

std::string Base64Encode(std::string_view bytes);

// \error InvalidArgument when the length is not a multiple of 4, a character is
//        outside the alphabet, or '=' padding is misplaced.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace ptc::cluster
