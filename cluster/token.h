// The shared secret of a job's peer data plane (docs/cluster.md): every
// request to a PeerServer carries it as "Authorization: Bearer TOKEN". The
// token lives in a file only its owner can read (mode 0600 or tighter), like
// an ssh private key.
//
// Thread safety: pure functions (ReadTokenFile reads the file system).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc::cluster {

inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// \error InvalidArgument when the token is shorter than kMinTokenBytes, longer
//        than kMaxTokenBytes, or holds a byte outside printable ASCII (0x21-0x7e:
//        no space, no control character), so that it fits an HTTP header as it is.
Status ValidateToken(std::string_view token);

// The token in the file at `path`: its content without trailing whitespace
// (a final newline), then checked by ValidateToken.
// \error NotFound / IOError when the file cannot be opened or read, naming the path.
// \error PermissionDenied naming the path and the mode when it is not a regular
//        file, or its mode grants anything beyond 0600 (group, other or execute bits).
// \error InvalidArgument naming the path, as ValidateToken.
Result<std::string> ReadTokenFile(const std::string& path);

// a == b, in a time that does not depend on where they differ (their
// lengths are not secret).
bool TokenEquals(std::string_view a, std::string_view b);

}  // namespace ptc::cluster
