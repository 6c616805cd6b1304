#include <cstdio>

#include <string>
#include <vector>

#include "ptc/store/store_layout.h"
#include "tools/commands.h"

namespace ptcfs {

int Report(const char* command, const ptc::Status& status) {
  if (status.ok()) return 0;
  // Messages quote inputs: never the whole of a huge one.
  std::fprintf(stderr, "ptcfs %s: %s\n", command, ptc::Printable(ptc::Abbreviate(status.message(), 2000)).c_str());
  switch (status.code()) {
    case ptc::Code::kInvalidArgument:
    case ptc::Code::kNotFound:
      return 2;
    default:
      return 1;
  }
}

void CollectAfterCommit(const char* command, ptc::Store& store, bool keep_old) {
  if (keep_old) return;
  const ptc::Status s = store.CollectGarbage();
  if (s.ok()) return;
  std::string left;
  const uint64_t current = store.current_generation();
  if (auto names = store.env()->ListDir(store.root()); names.ok()) {
    for (const std::string& name : *names) {
      const std::optional<uint64_t> g = ptc::ParseGenerationDirName(name);
      if (g && *g < current) left += (left.empty() ? "" : ", ") + store.AbsPath(name);
    }
  }
  std::fprintf(stderr,
               "ptcfs %s: warning: generation %llu is committed, but removing older generations failed: %s; left "
               "behind: %s (the next commit tries again)\n",
               command, static_cast<unsigned long long>(current), ptc::Printable(s.message()).c_str(),
               left.empty() ? "files in the current generation's directories" : left.c_str());
}

}  // namespace ptcfs
