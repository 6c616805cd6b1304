// Path helpers and whole-file helpers shared by every Env.
#include "ptc/base/env.h"

#include <unistd.h>

namespace ptc {

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  if (out.back() != '/') out.push_back('/');
  size_t skip = 0;
  while (skip < b.size() && b[skip] == '/') ++skip;
  out.append(b.substr(skip));
  return out;
}

std::string DirName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

Result<std::string> ReadFileToString(Env* env, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(path));
  std::string out(file->Size(), '\0');
  if (!out.empty()) PTC_RETURN_IF_ERROR(file->Read(0, out.size(), out.data()));
  return out;
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  Status s = [&]() -> Status {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->OpenWrite(tmp));
    PTC_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
    PTC_RETURN_IF_ERROR(file->Sync());
    PTC_RETURN_IF_ERROR(file->Close());
    PTC_RETURN_IF_ERROR(env->Rename(tmp, path));
    return env->SyncDir(DirName(path));
  }();
  // A failed rename leaves the temporary behind; remove it (best effort). After a
  // successful rename tmp no longer exists and only SyncDir can have failed.
  if (!s.ok() && env->Exists(tmp)) (void)env->Remove(tmp);
  return s;
}

Status WriteFileAtomic(OutputDir& dir, const std::string& name, std::string_view contents) {
  const std::string tmp = name + ".tmp";
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, dir.NewWritableFile(tmp));
  PTC_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
  PTC_RETURN_IF_ERROR(file->Sync());
  PTC_RETURN_IF_ERROR(file->Close());
  PTC_RETURN_IF_ERROR(dir.Rename(tmp, name));
  return dir.Sync();
}

Status CheckEntryName(std::string_view dir, std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos) {
    return InvalidArgumentError(std::string(dir) + ": '" + std::string(name) +
                                "' is not a file name (empty, '.', '..', or with '/')");
  }
  return Status::OK();
}

uint64_t Env::MemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace ptc
