#include "ptc/base/fault_injection_env.h"

namespace ptc {
namespace {

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}

  Status Append(const void* data, size_t n) override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kAppend, path_));
    return base_->Append(data, n);
  }
  Status PWrite(uint64_t offset, const void* data, size_t n) override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kPWrite, path_));
    return base_->PWrite(offset, data, n);
  }
  Status Sync() override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kSync, path_));
    return base_->Sync();
  }
  Status Close() override { return base_->Close(); }

 private:
  FaultInjectionEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

// The base Env's output directory, its entries counted and failed as the
// Env's paths are.
class FaultOutputDir final : public OutputDir {
 public:
  FaultOutputDir(FaultInjectionEnv* env, std::unique_ptr<OutputDir> base) : env_(env), base_(std::move(base)) {}
  const std::string& path() const override { return base_->path(); }
  Result<std::unique_ptr<OutputDir>> CreateDir(const std::string& name) override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kCreateDirs, JoinPath(path(), name)));
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> dir, base_->CreateDir(name));
    return std::unique_ptr<OutputDir>(new FaultOutputDir(env_, std::move(dir)));
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& name) override {
    const std::string path = JoinPath(base_->path(), name);
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kOpenWrite, path));
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(name));
    return std::unique_ptr<WritableFile>(new FaultWritableFile(env_, path, std::move(file)));
  }
  Result<std::vector<Entry>> List() override { return base_->List(); }
  Result<std::unique_ptr<OutputDir>> OpenDir(const std::string& name) override {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> dir, base_->OpenDir(name));
    return std::unique_ptr<OutputDir>(new FaultOutputDir(env_, std::move(dir)));
  }
  Status Remove(const std::string& name) override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kRemove, JoinPath(path(), name)));
    return base_->Remove(name);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kRename, JoinPath(path(), from)));
    return base_->Rename(from, to);
  }
  Status Sync() override {
    PTC_RETURN_IF_ERROR(env_->MaybeFail(FaultInjectionEnv::Op::kSyncDir, path()));
    return base_->Sync();
  }

 private:
  FaultInjectionEnv* env_;
  std::unique_ptr<OutputDir> base_;
};

bool IsRenameOrSync(FaultInjectionEnv::Op op) {
  using Op = FaultInjectionEnv::Op;
  return op == Op::kRename || op == Op::kSync || op == Op::kSyncDir;
}

}  // namespace

std::string_view FaultInjectionEnv::OpName(Op op) {
  switch (op) {
    case Op::kOpenWrite:
      return "OpenWrite";
    case Op::kOpenExisting:
      return "OpenExisting";
    case Op::kAppend:
      return "Append";
    case Op::kPWrite:
      return "PWrite";
    case Op::kSync:
      return "Sync";
    case Op::kRename:
      return "Rename";
    case Op::kLink:
      return "Link";
    case Op::kRemove:
      return "Remove";
    case Op::kRemoveTree:
      return "RemoveTree";
    case Op::kCreateDirs:
      return "CreateDirs";
    case Op::kSyncDir:
      return "SyncDir";
  }
  return "?";
}

FaultInjectionEnv::FaultInjectionEnv(Env* base) : base_(base) {}

void FaultInjectionEnv::FailAfter(int n_ops, Code code) {
  MutexLock lock(&mu_);
  armed_ = true;
  sticky_ = true;
  fail_at_ = n_ops;
  ops_ = 0;
  code_ = code;
}

void FaultInjectionEnv::FailOnceAfter(int n_ops, Code code) {
  FailAfter(n_ops, code);
  MutexLock lock(&mu_);
  sticky_ = false;
}

void FaultInjectionEnv::SetOnlyRenameAndSync(bool only) {
  MutexLock lock(&mu_);
  only_rename_sync_ = only;
  ops_ = 0;
}

void FaultInjectionEnv::Disarm() {
  MutexLock lock(&mu_);
  armed_ = false;
}

int FaultInjectionEnv::ops() const {
  MutexLock lock(&mu_);
  return ops_;
}

int FaultInjectionEnv::failures() const {
  MutexLock lock(&mu_);
  return failures_;
}

Status FaultInjectionEnv::MaybeFail(Op op, const std::string& path) {
  MutexLock lock(&mu_);
  if (only_rename_sync_ && !IsRenameOrSync(op)) return Status::OK();
  const int index = ops_++;
  const bool fail = armed_ && (sticky_ ? index >= fail_at_ : index == fail_at_);
  if (!fail) return Status::OK();
  ++failures_;
  return Status(code_, path + ": injected fault in " + std::string(OpName(op)) + " (op " + std::to_string(index) + ")");
}

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::OpenRead(const std::string& path) {
  return base_->OpenRead(path);
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::OpenWrite(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kOpenWrite, path));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->OpenWrite(path));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(file)));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::OpenExisting(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kOpenExisting, path));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->OpenExisting(path));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(file)));
}

bool FaultInjectionEnv::Exists(const std::string& path) { return base_->Exists(path); }
Result<uint64_t> FaultInjectionEnv::FileSize(const std::string& path) { return base_->FileSize(path); }
Result<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& path) { return base_->ListDir(path); }
bool FaultInjectionEnv::IsDirectory(const std::string& path) { return base_->IsDirectory(path); }

Status FaultInjectionEnv::CreateDirs(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kCreateDirs, path));
  return base_->CreateDirs(path);
}
Status FaultInjectionEnv::Rename(const std::string& from, const std::string& to) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kRename, from));
  return base_->Rename(from, to);
}
Status FaultInjectionEnv::Link(const std::string& from, const std::string& to) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kLink, from));
  return base_->Link(from, to);
}
Status FaultInjectionEnv::Remove(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kRemove, path));
  return base_->Remove(path);
}
Status FaultInjectionEnv::RemoveTree(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kRemoveTree, path));
  return base_->RemoveTree(path);
}
Status FaultInjectionEnv::SyncFileSystem(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kSync, path));
  return base_->SyncFileSystem(path);
}

Result<std::unique_ptr<OutputDir>> FaultInjectionEnv::OpenOutputDir(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kCreateDirs, path));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> dir, base_->OpenOutputDir(path));
  return std::unique_ptr<OutputDir>(new FaultOutputDir(this, std::move(dir)));
}

Status FaultInjectionEnv::SyncDir(const std::string& path) {
  PTC_RETURN_IF_ERROR(MaybeFail(Op::kSyncDir, path));
  return base_->SyncDir(path);
}

}  // namespace ptc
