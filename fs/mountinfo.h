// What /proc/self/mountinfo says of a mount point.
#pragma once

#include <string>

namespace ptcfs {

// "major:minor" of the file system mounted last at `path` (canonical: no
// symbolic links, no "." or ".."); empty when nothing is mounted there.
std::string MountDevice(const std::string& path);

}  // namespace ptcfs
