// The current time as records and status documents write it.
//
// Thread safety: a plain function, safe from any thread.
#pragma once

#include <string>

namespace ptc {

// Now in UTC, ISO 8601 to the second: "2026-12-06T03:20:38Z".
std::string UtcNowText();

}  // namespace ptc
