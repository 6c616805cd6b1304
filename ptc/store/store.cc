// The store: open and create, the current generation, garbage collection.
#include "ptc/store/store.h"

#include <optional>
#include <vector>

#include "ptc/store/generation_writer.h"

namespace ptc {

Store::Store(Env* env, std::string root) : env_(env), root_(std::move(root)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::Create(Env* env, std::string root) {
  if (env->Exists(root)) {
    if (!env->IsDirectory(root)) return AlreadyExistsError(root + ": exists and is not a directory");
    PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(root));
    if (!names.empty()) return AlreadyExistsError(root + ": directory is not empty; cannot create a store there");
  }
  PTC_RETURN_IF_ERROR(env->CreateDirs(root));
  PTC_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(root, kManifestName), EncodeRootManifest(0)));
  return std::unique_ptr<Store>(new Store(env, std::move(root)));
}

Result<std::unique_ptr<Store>> Store::Open(Env* env, std::string root) {
  const std::string path = JoinPath(root, kManifestName);
  Result<std::string> text = ReadFileToString(env, path);
  if (!text.ok() && text.status().code() == Code::kNotFound) {
    return NotFoundError(path + ": no ptcfs store here (" + text.status().message() + ")");
  }
  PTC_RETURN_IF_ERROR(text.status());
  PTC_ASSIGN_OR_RETURN(uint64_t g, DecodeRootManifest(path, *text));
  std::unique_ptr<Store> store(new Store(env, std::move(root)));
  if (g == 0) return store;
  Result<GenerationManifest> m = store->LoadGeneration(g);
  if (!m.ok()) {
    return CorruptionError(path + ": names generation " + std::to_string(g) +
                           ", which cannot be loaded: " + m.status().message());
  }
  store->SetCurrent(std::make_shared<const GenerationManifest>(std::move(m).value()));
  return store;
}

bool Store::has_generation() const { return CurrentSnapshot() != nullptr; }

uint64_t Store::current_generation() const {
  auto m = CurrentSnapshot();
  return m ? m->generation : 0;
}

const GenerationManifest& Store::current() const {
  MutexLock lock(&mu_);
  return *current_;
}

std::shared_ptr<const GenerationManifest> Store::CurrentSnapshot() const {
  MutexLock lock(&mu_);
  return current_;
}

void Store::SetCurrent(std::shared_ptr<const GenerationManifest> m) {
  MutexLock lock(&mu_);
  current_ = std::move(m);
}

void Store::WriterDone() {
  MutexLock lock(&mu_);
  writer_active_ = false;
}

std::string Store::AbsPath(const std::string& rel) const { return JoinPath(root_, rel); }

std::string Store::ManifestPath(uint64_t g) const { return AbsPath(JoinPath(GenerationDirName(g), kManifestName)); }

Result<GenerationManifest> Store::LoadGeneration(uint64_t g) const {
  const std::string path = ManifestPath(g);
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env_, path));
  PTC_ASSIGN_OR_RETURN(GenerationManifest m, DecodeManifest(path, text));
  if (m.generation != g) {
    return CorruptionError(path + ": says generation " + std::to_string(m.generation) + ", expected " +
                           std::to_string(g));
  }
  return m;
}

Status Store::RemoveUncommitted() {
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(root_));
  const uint64_t current = current_generation();
  for (const std::string& name : names) {
    std::optional<uint64_t> g = ParseGenerationDirName(name);
    if (g && *g > current) PTC_RETURN_IF_ERROR(env_->RemoveTree(AbsPath(name)), "removing uncommitted generation");
  }
  return Status::OK();
}

Result<std::unique_ptr<GenerationWriter>> Store::BeginGeneration() {
  {
    MutexLock lock(&mu_);
    if (writer_active_) return FailedPreconditionError(root_ + ": another generation is being written");
    writer_active_ = true;
  }
  const uint64_t next = current_generation() + 1;
  Status s = RemoveUncommitted();
  if (s.ok()) s = env_->CreateDirs(AbsPath(GenerationDirName(next)));
  if (!s.ok()) {
    WriterDone();
    return s;
  }
  return std::unique_ptr<GenerationWriter>(new GenerationWriter(this, next));
}

namespace {

// Removes every file under `rel` (relative to root) not in `keep`, and the
// directories that become empty. Returns whether `rel` itself is now empty.
Result<bool> PruneTree(const Store& store, const std::string& rel, const std::set<std::string>& keep) {
  Env* env = store.env();
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(store.AbsPath(rel)));
  bool empty = true;
  for (const std::string& name : names) {
    const std::string child = JoinPath(rel, name);
    const std::string abs = store.AbsPath(child);
    if (env->IsDirectory(abs)) {
      PTC_ASSIGN_OR_RETURN(bool child_empty, PruneTree(store, child, keep));
      if (child_empty) PTC_RETURN_IF_ERROR(env->Remove(abs));
      empty = empty && child_empty;
    } else if (keep.count(child)) {
      empty = false;
    } else {
      PTC_RETURN_IF_ERROR(env->Remove(abs));
    }
  }
  return empty;
}

}  // namespace

Status Store::CollectGarbage(const std::set<uint64_t>& keep_generations) {
  {
    MutexLock lock(&mu_);
    if (writer_active_)
      return FailedPreconditionError(root_ + ": cannot collect garbage while a generation is written");
    writer_active_ = true;  // blocks BeginGeneration until done
  }
  struct Done {
    Store* s;
    ~Done() { s->WriterDone(); }
  } done{this};

  auto current = CurrentSnapshot();
  const uint64_t current_gen = current ? current->generation : 0;
  std::set<uint64_t> live;
  std::set<std::string> keep;  // relative paths of files that stay
  auto add_live = [&](const GenerationManifest& m) {
    live.insert(m.generation);
    keep.insert(JoinPath(GenerationDirName(m.generation), kManifestName));
    for (const ShardRecord& s : m.shards) keep.insert(s.file);
  };
  if (current) add_live(*current);
  for (uint64_t g : keep_generations) {
    if (g == current_gen || g > current_gen || g == 0) continue;
    Result<GenerationManifest> m = LoadGeneration(g);
    if (!m.ok() && m.status().code() == Code::kNotFound) continue;  // already gone
    PTC_RETURN_IF_ERROR(m.status(), "collecting garbage");
    add_live(*m);
  }
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(root_));
  for (const std::string& name : names) {
    std::optional<uint64_t> g = ParseGenerationDirName(name);
    if (!g || *g > current_gen || !env_->IsDirectory(AbsPath(name))) continue;  // uncommitted: BeginGeneration's
    PTC_ASSIGN_OR_RETURN(bool empty, PruneTree(*this, name, keep), "collecting garbage");
    if (empty && !live.count(*g)) PTC_RETURN_IF_ERROR(env_->Remove(AbsPath(name)), "collecting garbage");
  }
  return env_->SyncDir(root_);
}

}  // namespace ptc
