#include "fs/staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "ptc/base/regular_file.h"

namespace ptcfs {

ptc::Result<std::string> Staging::Join(const std::string& parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return ptc::InvalidArgumentError("'" + name + "' is not a file name");
  }
  return parent.empty() ? name : parent + "/" + name;
}

ptc::Status Staging::Mkdir(const std::string& rel) {
  if (::mkdir(root_.c_str(), 0755) != 0 && errno != EEXIST) return ptc::ErrnoError(root_, errno);
  if (::mkdir(Path(rel).c_str(), 0755) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Result<int> Staging::Open(const std::string& rel, int flags) {
  // Without blocking, regular files only: a FIFO planted in STORE/ingest/
  // would hold staging_mu_ (and every save) in open(2) waiting for a reader.
  return ptc::OpenRegularFile(Path(rel), flags, "");
}

ptc::Result<struct stat> Staging::Stat(const std::string& rel) const {
  struct stat st;
  if (::lstat(Path(rel).c_str(), &st) != 0) return ptc::ErrnoError(Path(rel), errno);
  return st;
}

ptc::Status Staging::Rename(const std::string& from, const std::string& to) {
  if (::rename(Path(from).c_str(), Path(to).c_str()) != 0) return ptc::ErrnoError(Path(from), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Unlink(const std::string& rel) {
  if (::unlink(Path(rel).c_str()) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Rmdir(const std::string& rel) {
  if (::rmdir(Path(rel).c_str()) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Truncate(const std::string& rel, uint64_t size) {
  if (::truncate(Path(rel).c_str(), static_cast<off_t>(size)) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::RemoveTree(const std::string& rel) {
  std::error_code ec;
  std::filesystem::remove_all(Path(rel), ec);
  if (ec) return ptc::IOError(Path(rel) + ": " + ec.message());
  return ptc::Status::OK();
}

std::vector<std::pair<std::string, bool>> Staging::List(const std::string& rel) const {
  std::vector<std::pair<std::string, bool>> out;
  DIR* d = ::opendir(Path(rel).c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    out.emplace_back(name, e->d_type == DT_DIR);
  }
  ::closedir(d);
  return out;
}

}  // namespace ptcfs
