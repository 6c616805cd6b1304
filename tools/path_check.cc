#include "tools/path_check.h"

#include <filesystem>

namespace ptcfs {
namespace {

namespace fs = std::filesystem;

// The absolute path with links resolved as far as it exists, no trailing '/'.
std::string Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  std::string s = (ec ? fs::absolute(path).lexically_normal() : p).string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// Whether `inner` is `outer` or lies below it (both Resolved).
bool Within(const std::string& inner, const std::string& outer) {
  if (outer == "/") return true;
  return inner == outer || (inner.size() > outer.size() && inner.starts_with(outer) && inner[outer.size()] == '/');
}

}  // namespace

ptc::Status CheckOutsideStore(const std::string& store, const std::string& path) {
  if (Within(Resolved(path), Resolved(store))) {
    return ptc::InvalidArgumentError(path + ": inside the store " + store +
                                     " (a later commit would remove what is written there); choose a directory "
                                     "outside it");
  }
  return ptc::Status::OK();
}

ptc::Status CheckMountpointApart(const std::string& store, const std::string& mountpoint) {
  const std::string s = Resolved(store), m = Resolved(mountpoint);
  if (Within(m, s)) {
    return ptc::InvalidArgumentError(mountpoint + ": " + (m == s ? "is" : "inside") + " the store " + store +
                                     " it would serve (the mount would hide the store's files from the daemon); "
                                     "mount elsewhere");
  }
  if (Within(s, m)) {
    return ptc::InvalidArgumentError(mountpoint + ": holds the store " + store +
                                     " it would serve (the daemon would read the store through its own mount); "
                                     "mount elsewhere");
  }
  return ptc::Status::OK();
}

}  // namespace ptcfs
