// NewMemEnv(): an Env that keeps every file in memory, for tests.
//
// Files are shared byte strings: an open handle keeps its contents alive after
// Remove or a Rename over it, as a POSIX inode would. Directories exist
// explicitly (CreateDirs) or implicitly (a file or directory below them), and
// "" / "." / "/" always exist. Paths are normalised only by collapsing repeated
// and trailing slashes.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "ptc/base/env.h"
#include "ptc/base/mutex.h"

namespace ptc {
namespace {

struct FileData {
  mutable Mutex mu;
  std::string bytes GUARDED_BY(mu);
};

std::string Normalize(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::string path, std::shared_ptr<FileData> data)
      : path_(std::move(path)), data_(std::move(data)) {}

  Status Read(uint64_t offset, size_t n, void* dst) const override {
    MutexLock lock(&data_->mu);
    const uint64_t size = data_->bytes.size();
    if (offset > size || n > size - offset) {
      return CorruptionError(path_ + ": unexpected end of file reading " + std::to_string(n) + " bytes at offset " +
                             std::to_string(offset) + " (file size " + std::to_string(size) + ")");
    }
    if (n > 0) std::memcpy(dst, data_->bytes.data() + offset, n);
    return Status::OK();
  }
  uint64_t Size() const override {
    MutexLock lock(&data_->mu);
    return data_->bytes.size();
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  std::shared_ptr<FileData> data_;
};

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::string path, std::shared_ptr<FileData> data, uint64_t pos)
      : path_(std::move(path)), data_(std::move(data)), pos_(pos) {}

  Status Append(const void* data, size_t n) override {
    PTC_RETURN_IF_ERROR(PWrite(pos_, data, n));
    pos_ += n;
    return Status::OK();
  }
  Status PWrite(uint64_t offset, const void* data, size_t n) override {
    if (closed_) return FailedPreconditionError(path_ + ": write after close");
    MutexLock lock(&data_->mu);
    if (data_->bytes.size() < offset + n) data_->bytes.resize(offset + n, '\0');
    if (n > 0) std::memcpy(data_->bytes.data() + offset, data, n);
    return Status::OK();
  }
  Status Sync() override {
    if (closed_) return FailedPreconditionError(path_ + ": sync after close");
    return Status::OK();
  }
  Status Close() override {
    closed_ = true;
    return Status::OK();
  }

 private:
  std::string path_;
  std::shared_ptr<FileData> data_;
  uint64_t pos_;
  bool closed_ = false;
};

// An output directory of the MemEnv, by path: there are no links in memory,
// and names are checked as POSIX's are.
class MemOutputDir final : public OutputDir {
 public:
  MemOutputDir(Env* env, std::string path) : env_(env), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  Result<std::unique_ptr<OutputDir>> CreateDir(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    PTC_RETURN_IF_ERROR(env_->CreateDirs(path));
    return std::unique_ptr<OutputDir>(new MemOutputDir(env_, path));
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    if (env_->Exists(path)) return AlreadyExistsError(path + ": exists (output files are created, never overwritten)");
    return env_->OpenWrite(path);
  }
  Result<std::vector<Entry>> List() override {
    PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(path_));
    std::vector<Entry> entries;
    for (std::string& name : names) {
      const EntryKind kind = env_->IsDirectory(JoinPath(path_, name)) ? EntryKind::kDirectory : EntryKind::kFile;
      entries.push_back({std::move(name), kind});
    }
    return entries;
  }
  Result<std::unique_ptr<OutputDir>> OpenDir(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    const std::string path = JoinPath(path_, name);
    if (!env_->IsDirectory(path)) {
      if (env_->Exists(path)) return FailedPreconditionError(path + ": not a directory");
      return NotFoundError(path + ": no such directory");
    }
    return std::unique_ptr<OutputDir>(new MemOutputDir(env_, path));
  }
  Status Remove(const std::string& name) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, name));
    return env_->Remove(JoinPath(path_, name));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, from));
    PTC_RETURN_IF_ERROR(CheckEntryName(path_, to));
    return env_->Rename(JoinPath(path_, from), JoinPath(path_, to));
  }
  Status Sync() override { return env_->SyncDir(path_); }

 private:
  Env* const env_;
  const std::string path_;
};

class MemEnv final : public Env {
 public:
  Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) override {
    MutexLock lock(&mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) return NotFoundError(path + ": open for reading: No such file or directory");
    return std::unique_ptr<RandomAccessFile>(new MemRandomAccessFile(path, it->second));
  }

  Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) override {
    MutexLock lock(&mu_);
    const std::string p = Normalize(path);
    PTC_RETURN_IF_ERROR(CheckCanCreate(p), path + ": open for writing");
    auto data = std::make_shared<FileData>();
    files_[p] = data;
    return std::unique_ptr<WritableFile>(new MemWritableFile(path, std::move(data), 0));
  }

  Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) override {
    MutexLock lock(&mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) return NotFoundError(path + ": open existing for writing: No such file or directory");
    uint64_t size;
    {
      MutexLock file_lock(&it->second->mu);
      size = it->second->bytes.size();
    }
    return std::unique_ptr<WritableFile>(new MemWritableFile(path, it->second, size));
  }

  bool Exists(const std::string& path) override {
    MutexLock lock(&mu_);
    const std::string p = Normalize(path);
    return files_.count(p) > 0 || DirExists(p);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    MutexLock lock(&mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) {
      if (DirExists(Normalize(path))) return uint64_t{0};
      return NotFoundError(path + ": stat: No such file or directory");
    }
    MutexLock file_lock(&it->second->mu);
    return static_cast<uint64_t>(it->second->bytes.size());
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    MutexLock lock(&mu_);
    const std::string p = Normalize(path);
    if (files_.count(p)) return IOError(path + ": list directory: Not a directory");
    if (!DirExists(p)) return NotFoundError(path + ": list directory: No such file or directory");
    std::set<std::string> names;
    const std::string prefix = Prefix(p);
    auto collect = [&](const std::string& entry) {
      if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) return;
      std::string rest = entry.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('/')));
    };
    for (const auto& [name, data] : files_) collect(name);
    for (const std::string& dir : dirs_) collect(dir);
    return std::vector<std::string>(names.begin(), names.end());
  }

  Status CreateDirs(const std::string& path) override {
    MutexLock lock(&mu_);
    const std::string p = Normalize(path);
    for (size_t pos = 0; pos != std::string::npos;) {
      pos = p.find('/', pos + 1);
      std::string part = p.substr(0, pos);
      if (files_.count(part)) return AlreadyExistsError(path + ": create directories: " + part + " is a file");
    }
    for (size_t pos = 0; pos != std::string::npos;) {
      pos = p.find('/', pos + 1);
      dirs_.insert(p.substr(0, pos));
    }
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status RemoveTree(const std::string& path) override;

  Status SyncFileSystem(const std::string& path) override { return Status::OK(); }

  Status SyncDir(const std::string& path) override {
    MutexLock lock(&mu_);
    if (!DirExists(Normalize(path))) return NotFoundError(path + ": fsync directory: No such file or directory");
    return Status::OK();
  }

  bool IsDirectory(const std::string& path) override {
    MutexLock lock(&mu_);
    return DirExists(Normalize(path));
  }

  Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) override {
    PTC_RETURN_IF_ERROR(CreateDirs(path));
    return std::unique_ptr<OutputDir>(new MemOutputDir(this, path));
  }

 private:
  static std::string Prefix(const std::string& dir) {
    if (dir.empty() || dir == ".") return "";
    return dir == "/" ? dir : dir + "/";
  }
  static bool IsUnder(const std::string& entry, const std::string& prefix) {
    return entry.size() > prefix.size() && entry.compare(0, prefix.size(), prefix) == 0;
  }

  bool DirExists(const std::string& p) const REQUIRES(mu_) {
    if (p.empty() || p == "." || p == "/") return true;
    if (dirs_.count(p)) return true;
    const std::string prefix = Prefix(p);
    auto f = files_.lower_bound(prefix);
    if (f != files_.end() && IsUnder(f->first, prefix)) return true;
    auto d = dirs_.lower_bound(prefix);
    return d != dirs_.end() && IsUnder(*d, prefix);
  }

  Status CheckCanCreate(const std::string& p) const REQUIRES(mu_) {
    if (DirExists(p)) return IOError("Is a directory");
    std::string parent = DirName(p);
    if (files_.count(parent)) return IOError("Not a directory");
    if (!DirExists(parent)) return NotFoundError("No such file or directory");
    return Status::OK();
  }

  Mutex mu_;
  std::map<std::string, std::shared_ptr<FileData>> files_ GUARDED_BY(mu_);
  std::set<std::string> dirs_ GUARDED_BY(mu_);
};

Status MemEnv::Link(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  const std::string f = Normalize(from), t = Normalize(to);
  const std::string what = "link " + from + " -> " + to;
  auto it = files_.find(f);
  if (it == files_.end()) return NotFoundError(what + ": No such file or directory");
  if (files_.count(t) || DirExists(t)) return AlreadyExistsError(what + ": File exists");
  PTC_RETURN_IF_ERROR(CheckCanCreate(t), what);
  files_[t] = it->second;  // the same bytes under both names
  return Status::OK();
}

Status MemEnv::Rename(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  const std::string f = Normalize(from), t = Normalize(to);
  const std::string what = "rename " + from + " -> " + to;
  if (f == t && (files_.count(f) || DirExists(f))) return Status::OK();
  auto it = files_.find(f);
  if (it != files_.end()) {
    PTC_RETURN_IF_ERROR(CheckCanCreate(t), what);
    auto data = it->second;
    files_.erase(it);
    files_[t] = std::move(data);
    return Status::OK();
  }
  if (!DirExists(f)) return NotFoundError(what + ": No such file or directory");
  if (files_.count(t)) return IOError(what + ": Not a directory");
  if (IsUnder(t, Prefix(f))) return InvalidArgumentError(what + ": Invalid argument");
  if (DirExists(t)) {
    const std::string tp = Prefix(t);
    auto fi = files_.lower_bound(tp);
    auto di = dirs_.lower_bound(tp);
    if ((fi != files_.end() && IsUnder(fi->first, tp)) || (di != dirs_.end() && IsUnder(*di, tp))) {
      return IOError(what + ": Directory not empty");
    }
  } else if (!DirExists(DirName(t))) {
    return NotFoundError(what + ": No such file or directory");
  }
  const std::string fp = Prefix(f), tp = Prefix(t);
  std::map<std::string, std::shared_ptr<FileData>> moved_files;
  for (auto i = files_.begin(); i != files_.end();) {
    if (IsUnder(i->first, fp)) {
      moved_files[tp + i->first.substr(fp.size())] = i->second;
      i = files_.erase(i);
    } else {
      ++i;
    }
  }
  std::set<std::string> moved_dirs;
  for (auto i = dirs_.begin(); i != dirs_.end();) {
    if (*i == f || IsUnder(*i, fp)) {
      moved_dirs.insert(*i == f ? t : tp + i->substr(fp.size()));
      i = dirs_.erase(i);
    } else {
      ++i;
    }
  }
  moved_dirs.insert(t);
  files_.merge(moved_files);
  dirs_.merge(moved_dirs);
  return Status::OK();
}

Status MemEnv::Remove(const std::string& path) {
  MutexLock lock(&mu_);
  const std::string p = Normalize(path);
  if (files_.erase(p)) return Status::OK();
  if (!DirExists(p)) return NotFoundError(path + ": remove: No such file or directory");
  const std::string prefix = Prefix(p);
  auto f = files_.lower_bound(prefix);
  auto d = dirs_.lower_bound(prefix);
  if ((f != files_.end() && IsUnder(f->first, prefix)) || (d != dirs_.end() && IsUnder(*d, prefix))) {
    return IOError(path + ": remove: Directory not empty");
  }
  dirs_.erase(p);
  return Status::OK();
}

Status MemEnv::RemoveTree(const std::string& path) {
  MutexLock lock(&mu_);
  const std::string p = Normalize(path);
  const std::string prefix = Prefix(p);
  files_.erase(p);
  dirs_.erase(p);
  std::erase_if(files_, [&](const auto& kv) { return IsUnder(kv.first, prefix); });
  std::erase_if(dirs_, [&](const std::string& d) { return IsUnder(d, prefix); });
  return Status::OK();
}

}  // namespace

std::unique_ptr<Env> NewMemEnv() { return std::make_unique<MemEnv>(); }

}  // namespace ptc
