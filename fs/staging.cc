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

// The directory holding `rel`'s last name, walked to from the root without
// following a link (ptc::OpenDirBeneath), and that name, checked: each
// operation below acts on it with the *at call that follows no link either.
struct Parent {
  ptc::UniqueFd dir;
  std::string name;
};

ptc::Result<Parent> OpenParent(const std::string& root, const std::string& rel, bool create_root) {
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd root_fd, OpenRoot(root, create_root));
  auto [dir, name] = SplitLast(rel);
  PTC_RETURN_IF_ERROR(ptc::CheckEntryName(dir.empty() ? root : root + "/" + dir, name));
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd parent, ptc::OpenDirBeneath(root_fd.get(), dir, root));
  return Parent{std::move(parent), std::move(name)};
}

}  // namespace

ptc::Result<std::string> Staging::Join(const std::string& parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return ptc::InvalidArgumentError("'" + name + "' is not a file name");
  }
  return parent.empty() ? name : parent + "/" + name;
}

ptc::Status Staging::Mkdir(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(const Parent p, OpenParent(root_, rel, /*create_root=*/true));
  if (::mkdirat(p.dir.get(), p.name.c_str(), 0755) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Result<int> Staging::Open(const std::string& rel, int flags) {
  // Without blocking, regular files only: a FIFO planted in STORE/ingest/
  // would hold staging_mu_ (and every save) in open(2) waiting for a reader.
  PTC_ASSIGN_OR_RETURN(const Parent p, OpenParent(root_, rel, /*create_root=*/false));
  PTC_ASSIGN_OR_RETURN(ptc::UniqueFd fd, ptc::OpenRegularFileAt(p.dir.get(), p.name, flags, Path(rel)));
  return fd.release();
}

ptc::Result<struct stat> Staging::Stat(const std::string& rel) const {
  struct stat st;
  if (rel.empty()) {
    PTC_ASSIGN_OR_RETURN(const ptc::UniqueFd root, OpenRoot(root_, /*create=*/false));
    if (::fstat(root.get(), &st) != 0) return ptc::ErrnoError(root_, errno);
    return st;
  }
  PTC_ASSIGN_OR_RETURN(const Parent p, OpenParent(root_, rel, /*create_root=*/false));
  if (::fstatat(p.dir.get(), p.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return ptc::ErrnoError(Path(rel), errno);
  return st;
}

ptc::Status Staging::Rename(const std::string& from, const std::string& to) {
  PTC_ASSIGN_OR_RETURN(const Parent f, OpenParent(root_, from, /*create_root=*/false));
  PTC_ASSIGN_OR_RETURN(const Parent t, OpenParent(root_, to, /*create_root=*/false));
  if (::renameat(f.dir.get(), f.name.c_str(), t.dir.get(), t.name.c_str()) != 0) {
    return ptc::ErrnoError(Path(from), errno);
  }
  return ptc::Status::OK();
}

ptc::Status Staging::Unlink(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(const Parent p, OpenParent(root_, rel, /*create_root=*/false));
  if (::unlinkat(p.dir.get(), p.name.c_str(), 0) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Rmdir(const std::string& rel) {
  PTC_ASSIGN_OR_RETURN(const Parent p, OpenParent(root_, rel, /*create_root=*/false));
  if (::unlinkat(p.dir.get(), p.name.c_str(), AT_REMOVEDIR) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::Truncate(const std::string& rel, uint64_t size) {
  PTC_ASSIGN_OR_RETURN(const int fd, Open(rel, O_WRONLY));
  const ptc::UniqueFd file(fd);
  if (::ftruncate(file.get(), static_cast<off_t>(size)) != 0) return ptc::ErrnoError(Path(rel), errno);
  return ptc::Status::OK();
}

ptc::Status Staging::RemoveTree(const std::string& rel) {
  ptc::Result<Parent> p = OpenParent(root_, rel, /*create_root=*/false);
  if (p.status().code() == ptc::Code::kNotFound) return ptc::Status::OK();  // the root or a parent absent
  PTC_RETURN_IF_ERROR(p.status());
  return ptc::RemoveTreeAt(p->dir.get(), p->name, Path(rel));
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
