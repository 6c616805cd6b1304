// The store: open and create, the current generation, garbage collection.
#include "ptc/store/store.h"

#include <algorithm>
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
    std::erase(names, std::string(kStoreLockName));
    if (!names.empty()) return AlreadyExistsError(root + ": directory is not empty; cannot create a store there");
  }
  PTC_RETURN_IF_ERROR(env->CreateDirs(root));
  // The writer lock's file, empty (store_lock.h). Never replaced once there: a holder's flock is on it.
  const std::string lock = JoinPath(root, kStoreLockName);
  if (!env->Exists(lock)) PTC_RETURN_IF_ERROR(WriteFileAtomic(env, lock, ""));
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

Result<std::unique_ptr<Store>> Store::OpenForWrite(Env* env, std::string root, const StoreLockOptions& lock) {
  PTC_ASSIGN_OR_RETURN(StoreLock held, StoreLock::Acquire(root, lock));
  return OpenLocked(env, std::move(root), std::move(held), lock.create_dir);
}

Result<std::unique_ptr<Store>> Store::OpenLocked(Env* env, std::string root, StoreLock lock, bool create) {
  std::unique_ptr<Store> store;
  if (create && !env->Exists(JoinPath(root, kManifestName))) {
    PTC_ASSIGN_OR_RETURN(store, Create(env, std::move(root)));
  } else {
    PTC_ASSIGN_OR_RETURN(store, Open(env, std::move(root)));
  }
  store->lock_ = std::move(lock);
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

void Store::WriterDone(uint64_t abandoned) {
  StoreLock released = std::move(write_lock_);  // let go before others may start
  MutexLock lock(&mu_);
  if (abandoned != 0) abandoned_.insert(abandoned);
  writer_active_ = false;
}

Status Store::CheckWriter() {
  if (!StoreLock::HeldByThisProcess(root_)) {
    StoreLockOptions options;
    PTC_ASSIGN_OR_RETURN(write_lock_, StoreLock::Acquire(root_, options));
  }
  const std::string path = AbsPath(std::string(kManifestName));
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env_, path));
  PTC_ASSIGN_OR_RETURN(uint64_t g, DecodeRootManifest(path, text));
  if (g != current_generation()) {
    return FailedPreconditionError(path + ": names generation " + std::to_string(g) + ", but this process opened " +
                                   "the store at generation " + std::to_string(current_generation()) +
                                   ": another writer changed it; open the store again");
  }
  return Status::OK();
}

Result<uint64_t> Store::NextGeneration() const {
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(root_));
  uint64_t top = current_generation();
  for (const std::string& name : names) {
    std::optional<uint64_t> g = ParseGenerationDirName(name);
    if (g && *g >= kMaxGeneration) {
      return FailedPreconditionError(AbsPath(name) + ": numbered above the generations ptcfs writes (at most " +
                                     std::to_string(kMaxGeneration) + "); remove or rename it");
    }
    if (g) top = std::max(top, *g);
  }
  return top + 1;
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

Status Store::RemoveUncommitted(uint64_t keep) {
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(root_));
  const uint64_t current = current_generation();
  std::set<uint64_t> ours;
  {
    MutexLock lock(&mu_);
    ours = abandoned_;
  }
  for (const std::string& name : names) {
    std::optional<uint64_t> g = ParseGenerationDirName(name);
    if (!g || *g <= current || *g == keep) continue;
    // A manifest.json in a directory that is not our own leftover: committed once, or another's.
    if (!ours.count(*g) && env_->Exists(AbsPath(JoinPath(name, kManifestName))) &&
        !env_->Exists(AbsPath(JoinPath(name, kUncommittedMarker)))) {
      continue;
    }
    PTC_RETURN_IF_ERROR(env_->RemoveTree(AbsPath(name)), "removing uncommitted generation");
  }
  MutexLock lock(&mu_);
  for (uint64_t g : ours) abandoned_.erase(g);
  return Status::OK();
}

Result<std::unique_ptr<GenerationWriter>> Store::BeginGeneration() { return Begin(std::nullopt); }

Result<std::unique_ptr<GenerationWriter>> Store::BeginGenerationAt(uint64_t g) { return Begin(g); }

Result<std::unique_ptr<GenerationWriter>> Store::Begin(std::optional<uint64_t> at) {
  {
    MutexLock lock(&mu_);
    if (writer_active_) return FailedPreconditionError(root_ + ": another generation is being written");
    writer_active_ = true;
  }
  Status s = CheckWriter();
  if (s.ok() && at && *at <= current_generation()) {
    s = FailedPreconditionError(root_ + ": cannot write generation " + std::to_string(*at) +
                                " here: it is not above the current " + std::to_string(current_generation()));
  }
  if (s.ok()) s = RemoveUncommitted(at.value_or(0));
  Result<uint64_t> next = s.ok() ? NextGeneration() : Result<uint64_t>(s);
  if (next.ok() && at) {
    // gen-<at> itself may be there (kept): every other directory must be below it.
    const bool kept = env_->IsDirectory(AbsPath(GenerationDirName(*at)));
    if (*next > *at + (kept ? 1 : 0)) {
      next = FailedPreconditionError(root_ + ": cannot write generation " + std::to_string(*at) + " here (current " +
                                     std::to_string(current_generation()) + ", next free " + std::to_string(*next) +
                                     ")");
    } else {
      next = *at;
    }
  }
  if (next.ok()) s = env_->CreateDirs(AbsPath(GenerationDirName(*next)));
  if (next.ok() && s.ok())
    s = WriteFileAtomic(env_, AbsPath(JoinPath(GenerationDirName(*next), kUncommittedMarker)), "");
  if (!next.ok() || !s.ok()) {
    if (next.ok()) {
      (void)env_->RemoveTree(AbsPath(GenerationDirName(*next)));  // ours, never committed
      WriterDone(*next);
    } else {
      WriterDone();
    }
    return next.ok() ? s : next.status();
  }
  return std::unique_ptr<GenerationWriter>(new GenerationWriter(this, *next));
}

namespace {

// Whether a kept file lies at `rel` or under it.
bool KeepsUnder(const std::set<std::string>& keep, const std::string& rel) {
  auto it = keep.lower_bound(rel);
  return it != keep.end() && (*it == rel || (it->size() > rel.size() && it->compare(0, rel.size(), rel) == 0 &&
                                             (*it)[rel.size()] == '/'));
}

// Removes every entry under `dir` (store-relative path `rel`) not in `keep`,
// and the directories that become empty. A symbolic link is never followed:
// kept as it is while a kept file lies under its path (a generation moved to
// another disk and linked back is read through it), otherwise the link alone
// is removed, never what it points at. Returns whether `dir` is now empty.
Result<bool> PruneTree(OutputDir& dir, const std::string& rel, const std::set<std::string>& keep) {
  PTC_ASSIGN_OR_RETURN(std::vector<OutputDir::Entry> entries, dir.List());
  bool empty = true;
  for (const OutputDir::Entry& e : entries) {
    const std::string child = JoinPath(rel, e.name);
    if (e.kind == OutputDir::EntryKind::kDirectory) {
      PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> sub, dir.OpenDir(e.name));
      PTC_ASSIGN_OR_RETURN(bool sub_empty, PruneTree(*sub, child, keep));
      if (sub_empty) PTC_RETURN_IF_ERROR(dir.Remove(e.name));
      empty = empty && sub_empty;
    } else if (KeepsUnder(keep, child)) {
      empty = false;
    } else {
      PTC_RETURN_IF_ERROR(dir.Remove(e.name));
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
  PTC_RETURN_IF_ERROR(CheckWriter());

  auto current = CurrentSnapshot();
  const uint64_t current_gen = current ? current->generation : 0;
  std::set<uint64_t> live;
  std::set<std::string> keep;  // relative paths of files that stay
  auto add_live = [&](const GenerationManifest& m) {
    live.insert(m.generation);
    keep.insert(JoinPath(GenerationDirName(m.generation), kManifestName));
    for (const ShardRecord& s : m.shards) {
      keep.insert(s.file);
      if (!s.h5.empty()) keep.insert(s.h5);
    }
    for (const RankFileCopies& f : m.rank_file_copies) keep.insert(f.file);
  };
  if (current) add_live(*current);
  for (uint64_t g : keep_generations) {
    if (g == current_gen || g > current_gen || g == 0) continue;
    Result<GenerationManifest> m = LoadGeneration(g);
    if (!m.ok() && m.status().code() == Code::kNotFound) continue;  // already gone
    PTC_RETURN_IF_ERROR(m.status(), "collecting garbage");
    add_live(*m);
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> root, env_->OpenOutputDir(root_), "collecting garbage");
  PTC_ASSIGN_OR_RETURN(std::vector<OutputDir::Entry> entries, root->List(), "collecting garbage");
  for (const OutputDir::Entry& e : entries) {
    std::optional<uint64_t> g = ParseGenerationDirName(e.name);
    if (!g || *g > current_gen) continue;  // not a generation, or uncommitted: BeginGeneration's
    if (e.kind == OutputDir::EntryKind::kLink) {
      // A generation directory moved elsewhere and linked back: read through,
      // never pruned through; the link goes when nothing kept lies under it.
      if (!KeepsUnder(keep, e.name)) PTC_RETURN_IF_ERROR(root->Remove(e.name), "collecting garbage");
      continue;
    }
    if (e.kind != OutputDir::EntryKind::kDirectory) continue;
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> dir, root->OpenDir(e.name), "collecting garbage");
    PTC_ASSIGN_OR_RETURN(bool empty, PruneTree(*dir, e.name, keep), "collecting garbage");
    if (empty && !live.count(*g)) PTC_RETURN_IF_ERROR(root->Remove(e.name), "collecting garbage");
  }
  return root->Sync();
}

}  // namespace ptc
