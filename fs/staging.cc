#include "fs/staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "ptc/base/dir_at.h"
#include "ptc/base/env.h"

namespace ptcfs {
namespace {

// "a/b/c" -> ("a/b", "c"); "c" -> ("", "c").
std::pair<std::string, std::string> SplitLast(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  if (slash == std::string::npos) return {"", rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

// The staging root `root` (STORE/ingest), opened from its parent without
// following a link at its own name; made first when `create`.
ptc::Result<ptc::UniqueFd> OpenRoot(const std::string& root, bool create) {
  const std::string parent_path = ptc::DirName(root);
  const int parent = ::open(parent_path.empty() ? "." : parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0) return ptc::ErrnoError(parent_path, errno);
  ptc::UniqueFd parent_fd(parent);
  const std::string name = root.substr(root.rfind('/') + 1);  // npos + 1 == 0
  if (create && ::mkdirat(parent, name.c_str(), 0755) != 0 && errno != EEXIST) return ptc::ErrnoError(root, errno);
  ptc::Result<ptc::UniqueFd> dir = ptc::OpenDirBeneath(parent, name, parent_path);
  if (dir.status().code() == ptc::Code::kPermissionDenied) {
    return ptc::Status(ptc::Code::kPermissionDenied,
                       root + ": a symbolic link (the staging area is never followed out of the store)");
  }
  return dir;
}

}  // namespace

ptc::Result<std::string> Staging::Join(const std::string& parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return ptc::InvalidArgumentError("'" + name + "' is not a file name");
  }
  return parent.empty() ? name : parent + "/" + name;
}

// Each operation below opens the root, walks to the parent of its last name
// beneath it (ptc::OpenDirBeneath: no link followed) and acts on that name
// with the *at call that does not follow one either.

ptc::Status Staging::Mkdir(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/true));
  const auto [dir, name] = SplitLast(rel);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root.get(), dir, root_));
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(dir), name));
  if (::mkdirat(parent.get(), name.c_str(), 0755) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Result<int> Staging::Open(const std::string& rel, int flags) {
  // Without blocking, regular files only: a FIFO planted in STORE/ingest/
  // would hold staging_mu_ (and every save) in open(2) waiting for a reader.
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
  const auto [dir, name] = SplitLast(rel);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root.get(), dir, root_));
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd fd, ptc::OpenRegularFileAt(parent.get(), name, flags, Path(rel)));
  return fd.release();
}

ptc::Result<struct stat> Staging::Stat(const std::string& rel) const {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
  if (rel.empty()) {
    struct stat st;
    if (::fstat(root.get(), &st) != 0) return ptc::ErrnoError(root_, errno);
    return st;
  }
  const auto [dir, name] = SplitLast(rel);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root.get(), dir, root_));
  struct stat st;
  if (::fstatat(parent.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return ptc::ErrnoError(Path(rel), errno);
  return st;
}

ptc::Status Staging::Rename(const std::string& from, const std::string& to) {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
  const auto [from_dir, from_name] = SplitLast(from);
  const auto [to_dir, to_name] = SplitLast(to);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd from_parent, ptc::OpenDirBeneath(root.get(), from_dir, root_));
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd to_parent, ptc::OpenDirBeneath(root.get(), to_dir, root_));
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(from_dir), from_name));
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(to_dir), to_name));
  if (::renameat(from_parent.get(), from_name.c_str(), to_parent.get(), to_name.c_str()) != 0)
    return ptc::ErrnoError(Path(from), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Unlink(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
  const auto [dir, name] = SplitLast(rel);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root.get(), dir, root_));
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(dir), name));
  if (::unlinkat(parent.get(), name.c_str(), 0) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Rmdir(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
  const auto [dir, name] = SplitLast(rel);
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root.get(), dir, root_));
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(dir), name));
  if (::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Truncate(const std::string& rel, uint64_t size) {
  PTC_ASSIGN_OR_RETURN(const int fd, Open(rel, O_WRONLY));
  const ptc::UniqueFd file(fd);
  if (::ftruncate(file.get(), static_cast<off_t>(size)) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::RemoveTree(const std::string& rel) {
  ptc::Result<ptc::UniqueFd> root = OpenRoot(root_, /*create=*/false);
  if (root.status().code() == ptc::Code::kNotFound) return ptc::Status::OK();
  PTC_RETURN_IF_ERROR(root.status());
  const auto [dir, name] = SplitLast(rel);
  ptc::Result<ptc::UniqueFd> parent = ptc::OpenDirBeneath(root->get(), dir, root_);
  if (parent.status().code() == ptc::Code::kNotFound) return ptc::Status::OK();
  PTC_RETURN_IF_ERROR(parent.status());
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(Path(dir), name));
  return ptc::RemoveTreeAt(parent->get(), name, Path(rel));
}

std::vector<std::pair<std::string, bool>> Staging::List(const std::string& rel) const {
  std::vector<std::pair<std::string, bool>> out;
  ptc::Result<ptc::UniqueFd> root = OpenRoot(root_, /*create=*/false);
  if (!root.ok()) return out;
  ptc::Result<ptc::UniqueFd> dir = ptc::OpenDirBeneath(root->get(), rel, root_);
  if (!dir.ok()) return out;
  ptc::Result<std::vector<ptc::OutputDir::Entry>> entries = ptc::ListAt(dir->get(), Path(rel));
  if (!entries.ok()) return out;
  for (const auto& e : *entries) {
    if (e.kind == ptc::OutputDir::EntryKind::kFile || e.kind == ptc::OutputDir::EntryKind::kDirectory)
      out.emplace_back(e.name, e.kind == ptc::OutputDir::EntryKind::kDirectory);
  }
  return out;
}

}  // namespace ptcfs
