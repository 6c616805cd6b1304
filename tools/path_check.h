// Where a command may write or mount, relative to a store: never inside it
// (a later commit's garbage collection would remove what it wrote) and, for a
// mount, never over it or above it (the daemon would read its own mount).
#pragma once

#include <string>

#include "ptc/base/status.h"

namespace ptcfs {

// `path` (an output directory, created or not) against the store at `store`,
// both resolved through links as far as they exist.
// \error InvalidArgument naming both when `path` is the store or lies inside it.
ptc::Status CheckOutsideStore(const std::string& store, const std::string& path);

// A mountpoint against the store it serves.
// \error InvalidArgument naming both when the mountpoint is the store, lies
//        inside it, or holds it.
ptc::Status CheckMountpointApart(const std::string& store, const std::string& mountpoint);

}  // namespace ptcfs
