#include <cstdio>

#include "tools/commands.h"

namespace ptcfs {

int Report(const char* command, const ptc::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "ptcfs %s: %s\n", command, status.message().c_str());
  switch (status.code()) {
    case ptc::Code::kInvalidArgument:
    case ptc::Code::kNotFound:
      return 2;
    default:
      return 1;
  }
}

}  // namespace ptcfs
