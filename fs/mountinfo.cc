#include "fs/mountinfo.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ptcfs {

std::string MountDevice(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string device;
  for (std::string line; std::getline(in, line);) {
    // Fields 3 (major:minor) and 5 (the mount point; spaces and the like as
    // octal escapes).
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (!(fields >> id >> parent >> dev >> root >> point)) continue;
    std::string unescaped;
    for (size_t i = 0; i < point.size(); ++i) {
      if (point[i] == '\\' && i + 3 < point.size()) {
        unescaped += static_cast<char>(std::strtol(point.substr(i + 1, 3).c_str(), nullptr, 8));
        i += 3;
      } else {
        unescaped += point[i];
      }
    }
    if (unescaped == path) device = dev;
  }
  return device;
}

}  // namespace ptcfs
