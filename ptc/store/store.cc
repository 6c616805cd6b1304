// The store: root manifest, generation directories, commit, garbage collection.
#include "ptc/store/store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "ptc/store/h5shard.h"

namespace ptc {
namespace {

using json = nlohmann::json;

constexpr std::string_view kRootFormat = "ptcfs-store";
constexpr int kRootVersion = 1;
constexpr std::string_view kManifestName = "manifest.json";
// Verification reads with pread in chunks that stay in the CPU cache between
// the copy and the hash: cheaper than mapping a few MiB per checked block.
constexpr size_t kVerifyChunk = 256 << 10;

std::string EncodeRoot(uint64_t generation) {
  nlohmann::ordered_json j;
  j["format"] = kRootFormat;
  j["version"] = kRootVersion;
  j["generation"] = generation;
  return j.dump() + "\n";
}

// The generation the root manifest names (0: none).
Result<uint64_t> DecodeRoot(const std::string& label, std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptionError(label + ": not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kRootFormat) {
    return CorruptionError(label + ": \"format\" must be \"ptcfs-store\"; not a ptcfs store");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_unsigned() || version->get<uint64_t>() != kRootVersion) {
    return CorruptionError(label + ": unsupported \"version\" (this build reads version 1)");
  }
  auto generation = j.find("generation");
  if (generation == j.end() || !generation->is_number_unsigned()) {
    return CorruptionError(label + ": \"generation\" must be a non-negative integer");
  }
  return generation->get<uint64_t>();
}

// Parses "gen-000007" -> 7.
std::optional<uint64_t> ParseGenerationDir(std::string_view name) {
  if (name.size() < 5 || name.substr(0, 4) != "gen-") return std::nullopt;
  uint64_t g = 0;
  for (char c : name.substr(4)) {
    if (c < '0' || c > '9' || g > UINT64_MAX / 10 - 10) return std::nullopt;
    g = g * 10 + static_cast<uint64_t>(c - '0');
  }
  return g;
}

std::string WorkerDirName(int worker) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "worker-%02d", worker);
  return buf;
}

// Starts writing a finished shard file's dirty pages to disk without waiting
// for them (sync_file_range SYNC_FILE_RANGE_WRITE), so that the disk works
// while later shards are assembled and the syncfs at Commit finds little left
// to do (measured: most of that syncfs overlaps the copy). A hint that moves no
// bytes, so it goes to the OS directly, as HDF5 does (a Store's files are on
// the real filesystem, see store.h); failures are ignored: Commit's syncfs is
// what makes the data durable.
void StartWriteback(const std::string& path) {
#ifdef SYNC_FILE_RANGE_WRITE
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  ::close(fd);
#endif
}

std::string ShardLabel(const ShardRecord& s) {
  std::string boxes;
  for (const Box& b : s.boxes) boxes += (boxes.empty() ? "" : " ") + b.ToString();
  return "tensor '" + s.tensor + "' boxes " + boxes + " in " + s.file;
}

}  // namespace

std::string SanitizeFileName(std::string_view tensor) {
  std::string out;
  for (char c : tensor.substr(0, 200)) {
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-';
    out.push_back(keep ? c : '_');
  }
  return out.empty() ? "_" : out;
}

std::string Store::GenerationDirName(uint64_t g) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "gen-%06" PRIu64, g);
  return buf;
}

// ---------------------------------------------------------------- Store

Store::Store(Env* env, std::string root) : env_(env), root_(std::move(root)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::Create(Env* env, std::string root) {
  if (env->Exists(root)) {
    if (!env->IsDirectory(root)) return AlreadyExistsError(root + ": exists and is not a directory");
    PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(root));
    if (!names.empty()) return AlreadyExistsError(root + ": directory is not empty; cannot create a store there");
  }
  PTC_RETURN_IF_ERROR(env->CreateDirs(root));
  PTC_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(root, kManifestName), EncodeRoot(0)));
  return std::unique_ptr<Store>(new Store(env, std::move(root)));
}

Result<std::unique_ptr<Store>> Store::Open(Env* env, std::string root) {
  const std::string path = JoinPath(root, kManifestName);
  Result<std::string> text = ReadFileToString(env, path);
  if (!text.ok() && text.status().code() == Code::kNotFound) {
    return NotFoundError(path + ": no ptcfs store here (" + text.status().message() + ")");
  }
  PTC_RETURN_IF_ERROR(text.status());
  PTC_ASSIGN_OR_RETURN(uint64_t g, DecodeRoot(path, *text));
  std::unique_ptr<Store> store(new Store(env, std::move(root)));
  if (g == 0) return store;
  Result<GenerationManifest> m = store->LoadGeneration(g);
  if (!m.ok()) {
    return CorruptionError(path + ": names generation " + std::to_string(g) + ", which cannot be loaded: " +
                           m.status().message());
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
  std::lock_guard<std::mutex> lock(mu_);
  return *current_;
}

std::shared_ptr<const GenerationManifest> Store::CurrentSnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void Store::SetCurrent(std::shared_ptr<const GenerationManifest> m) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(m);
}

void Store::WriterDone() {
  std::lock_guard<std::mutex> lock(mu_);
  writer_active_ = false;
}

std::string Store::AbsPath(const std::string& rel) const { return JoinPath(root_, rel); }

Result<GenerationManifest> Store::LoadGeneration(uint64_t g) const {
  const std::string path = AbsPath(JoinPath(GenerationDirName(g), kManifestName));
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
    std::optional<uint64_t> g = ParseGenerationDir(name);
    if (g && *g > current) PTC_RETURN_IF_ERROR(env_->RemoveTree(AbsPath(name)), "removing uncommitted generation");
  }
  return Status::OK();
}

Result<std::unique_ptr<GenerationWriter>> Store::BeginGeneration() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (writer_active_) return FailedPreconditionError(root_ + ": cannot collect garbage while a generation is written");
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
    std::optional<uint64_t> g = ParseGenerationDir(name);
    if (!g || *g > current_gen || !env_->IsDirectory(AbsPath(name))) continue;  // uncommitted: BeginGeneration's
    PTC_ASSIGN_OR_RETURN(bool empty, PruneTree(*this, name, keep), "collecting garbage");
    if (empty && !live.count(*g)) PTC_RETURN_IF_ERROR(env_->Remove(AbsPath(name)), "collecting garbage");
  }
  return env_->SyncDir(root_);
}

// ---------------------------------------------------------------- sinks

ShardSink::ShardSink(std::string abs_path, ShardRecord record, std::unique_ptr<WritableFile> file)
    : abs_path_(std::move(abs_path)), record_(std::move(record)), file_(std::move(file)) {}
ShardSink::~ShardSink() = default;

Status ShardSink::Append(const void* data, size_t n) {
  if (finished_) return FailedPreconditionError(record_.file + ": append after Finish");
  if (n > record_.nbytes - written_) {
    return InvalidArgumentError(record_.file + ": writing " + std::to_string(written_ + n) + " bytes into a shard of " +
                                std::to_string(record_.nbytes) + " (tensor '" + record_.tensor + "')");
  }
  PTC_RETURN_IF_ERROR(file_->PWrite(record_.offset + written_, data, n));
  hash_.Update(data, n);
  written_ += n;
  return Status::OK();
}

Result<ShardRecord> ShardSink::Finish() {
  if (finished_) return FailedPreconditionError(record_.file + ": Finish called twice");
  if (written_ != record_.nbytes) {
    return FailedPreconditionError(record_.file + ": " + std::to_string(written_) + " of " +
                                   std::to_string(record_.nbytes) + " bytes written (tensor '" + record_.tensor + "')");
  }
  // Not synced here: Commit makes all shard files durable at once (SyncFileSystem).
  PTC_RETURN_IF_ERROR(file_->Close());
  finished_ = true;
  StartWriteback(abs_path_);
  ShardDigest digest = hash_.Finish();
  record_.checksum = digest.checksum;
  record_.block_checksums = std::move(digest.blocks);
  return record_;
}

// ---------------------------------------------------------------- GenerationWriter

GenerationWriter::GenerationWriter(Store* store, uint64_t generation)
    : store_(store), generation_(generation), dir_(Store::GenerationDirName(generation)) {}

GenerationWriter::~GenerationWriter() {
  if (!committed_) (void)store_->env()->RemoveTree(store_->AbsPath(dir_));
  store_->WriterDone();
}

Result<std::string> GenerationWriter::PrepareShardFile(const std::string& tensor, DType dtype,
                                                       const std::vector<Box>& boxes, int worker,
                                                       ShardRecord& record) {
  if (committed_ || aborted_) return FailedPreconditionError(dir_ + ": generation already committed or aborted");
  if (worker < 0) return InvalidArgumentError("tensor '" + tensor + "': negative worker " + std::to_string(worker));
  const std::string stem = SanitizeFileName(tensor);
  const std::string worker_dir = JoinPath(dir_, WorkerDirName(worker));
  int k;
  {
    // The worker directory is created under the lock: a concurrent caller
    // for the same worker must not create its file before the directory exists.
    std::lock_guard<std::mutex> lock(mu_);
    if (!workers_.count(worker)) {
      PTC_RETURN_IF_ERROR(store_->env()->CreateDirs(store_->AbsPath(worker_dir)));
      workers_.insert(worker);
    }
    k = counters_[{stem, worker}]++;
  }
  record.tensor = tensor;
  record.boxes = boxes;
  record.worker = worker;
  record.file = JoinPath(worker_dir, stem + ".s" + std::to_string(k) + ".h5");
  record.nbytes = 0;
  for (const Box& b : boxes) record.nbytes += static_cast<uint64_t>(b.volume()) * DTypeSize(dtype);
  const std::string abs = store_->AbsPath(record.file);
  PTC_ASSIGN_OR_RETURN(record.offset, CreateH5Shard(abs, dtype, boxes, tensor));
  return abs;
}

Result<std::unique_ptr<ShardSink>> GenerationWriter::NewShard(const std::string& tensor, DType dtype,
                                                              std::vector<Box> boxes, int worker) {
  ShardRecord record;
  PTC_ASSIGN_OR_RETURN(std::string abs, PrepareShardFile(tensor, dtype, boxes, worker, record));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, store_->env()->OpenExisting(abs));
  return std::unique_ptr<ShardSink>(new ShardSink(std::move(abs), std::move(record), std::move(file)));
}

void GenerationWriter::AddShard(ShardRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  shards_.push_back(std::move(record));
}

// Syncs the shard directories, then writes gen-NNNNNN/manifest.json.
Status GenerationWriter::WriteGeneration(std::string_view manifest_text) {
  Env* env = store_->env();
  std::set<int> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers = workers_;
  }
  // Shard files are not synced one by one as they are written; one syncfs
  // makes them durable before the manifest that names them. A generation that
  // only references shards of committed generations (durable since their
  // commit) created no file: nothing to sync.
  if (!workers.empty()) PTC_RETURN_IF_ERROR(env->SyncFileSystem(store_->root()));
  for (int w : workers) PTC_RETURN_IF_ERROR(env->SyncDir(store_->AbsPath(JoinPath(dir_, WorkerDirName(w)))));
  const std::string path = store_->AbsPath(JoinPath(dir_, kManifestName));
  PTC_RETURN_IF_ERROR(WriteFileAtomic(env, path, manifest_text));
  return env->SyncDir(store_->root());
}

// The commit point: the root manifest.json names the new generation once renamed.
Status GenerationWriter::SwitchRoot() {
  Env* env = store_->env();
  const std::string path = store_->AbsPath(std::string(kManifestName));
  const std::string tmp = path + ".tmp";
  const std::string text = EncodeRoot(generation_);
  Status s = [&]() -> Status {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->OpenWrite(tmp));
    PTC_RETURN_IF_ERROR(file->Append(text.data(), text.size()));
    PTC_RETURN_IF_ERROR(file->Sync());
    PTC_RETURN_IF_ERROR(file->Close());
    return env->Rename(tmp, path);
  }();
  if (!s.ok()) {
    if (env->Exists(tmp)) (void)env->Remove(tmp);
    return s;
  }
  committed_ = true;
  s = env->SyncDir(store_->root());
  if (!s.ok()) {
    return s.WithContext(store_->root() + ": generation " + std::to_string(generation_) + " committed but not durable");
  }
  return Status::OK();
}

Status GenerationWriter::Commit(GenerationManifest meta) {
  if (committed_ || aborted_) return FailedPreconditionError(dir_ + ": generation already committed or aborted");
  auto previous = store_->CurrentSnapshot();
  meta.generation = generation_;
  meta.parent = previous ? std::optional<uint64_t>(previous->generation) : std::nullopt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    meta.shards = shards_;
  }
  const std::string label = store_->AbsPath(JoinPath(dir_, kManifestName));
  // The text written is the text validated (decoding it again gives `checked`).
  const std::string text = EncodeManifest(meta);
  Result<GenerationManifest> checked = DecodeManifest(label, text);
  Status s = checked.ok() ? Status::OK() : InvalidArgumentError(checked.status().message());
  for (size_t i = 0; s.ok() && i < meta.shards.size(); ++i) {
    const ShardRecord& shard = meta.shards[i];
    if (!store_->env()->Exists(store_->AbsPath(shard.file))) {
      s = NotFoundError(label + ": shard file " + shard.file + " of tensor '" + shard.tensor + "' does not exist");
    }
  }
  if (s.ok()) s = WriteGeneration(text);
  if (s.ok()) s = SwitchRoot();
  if (committed_) store_->SetCurrent(std::make_shared<const GenerationManifest>(std::move(checked).value()));
  if (!committed_) {
    aborted_ = true;
    (void)store_->env()->RemoveTree(store_->AbsPath(dir_));
  }
  return s;
}

// ---------------------------------------------------------------- readers

Status ReadShardBytes(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset_in_shard, size_t n,
                      void* dst) {
  if (offset_in_shard > shard.nbytes || n > shard.nbytes - offset_in_shard) {
    return InvalidArgumentError(ShardLabel(shard) + ": read of " + std::to_string(n) + " bytes at " +
                                std::to_string(offset_in_shard) + " leaves the shard of " +
                                std::to_string(shard.nbytes) + " bytes");
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(store.AbsPath(shard.file)));
  return file->Read(shard.offset + offset_in_shard, n, dst);
}

namespace {
// Shards smaller than this are read with pread: a mapping costs more.
constexpr uint64_t kMapMin = 256 << 10;
constexpr size_t kMapWindow = 8 << 20;
}  // namespace

VerifyingShardReader::VerifyingShardReader(const ShardRecord& shard, std::unique_ptr<RandomAccessFile> file,
                                           size_t block)
    : shard_(shard), file_(std::move(file)), block_(block), pos_(BlockBegin(shard, block)),
      mappable_(file_->fd() >= 0 && shard.nbytes >= kMapMin && file_->Size() >= shard.offset + shard.nbytes) {}

VerifyingShardReader::~VerifyingShardReader() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

Result<std::unique_ptr<VerifyingShardReader>> VerifyingShardReader::Open(Env* env, const Store& store,
                                                                         const ShardRecord& shard, size_t block) {
  if (block >= BlockCount(shard)) {
    return InvalidArgumentError(ShardLabel(shard) + ": no checksum block " + std::to_string(block));
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(store.AbsPath(shard.file)));
  return std::unique_ptr<VerifyingShardReader>(new VerifyingShardReader(shard, std::move(file), block));
}

Status VerifyingShardReader::CheckRange(size_t n) const {
  if (n > shard_.nbytes - pos_) {
    return InvalidArgumentError(ShardLabel(shard_) + ": read of " + std::to_string(n) + " bytes at " +
                                std::to_string(pos_) + " leaves the shard of " + std::to_string(shard_.nbytes) +
                                " bytes");
  }
  return Status::OK();
}

Status VerifyingShardReader::Consume(const char* p, size_t n) {
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, BlockEnd(shard_, block_) - pos_));
    hash_.Update(p, take);
    pos_ += take;
    p += take;
    n -= take;
    if (pos_ == BlockEnd(shard_, block_)) PTC_RETURN_IF_ERROR(EndBlock());
  }
  return Status::OK();
}

Status VerifyingShardReader::EndBlock() {
  const uint64_t got = hash_.Digest(), want = BlockChecksum(shard_, block_);
  if (got != want) {
    std::string where = ShardLabel(shard_) + ": checksum ";
    if (BlockCount(shard_) > 1) {
      where += "of block " + std::to_string(block_) + " (bytes " + std::to_string(BlockBegin(shard_, block_)) + "-" +
               std::to_string(BlockEnd(shard_, block_)) + ") ";
    }
    return CorruptionError(where + ChecksumToString(got) + " != " + ChecksumToString(want) + " in the manifest");
  }
  hash_.Reset();
  ++block_;
  return Status::OK();
}

Status VerifyingShardReader::Read(size_t n, void* dst) {
  PTC_RETURN_IF_ERROR(CheckRange(n));
  Status s = file_->Read(shard_.offset + pos_, n, dst);
  if (s.code() == Code::kCorruption) return CorruptionError(ShardLabel(shard_) + ": " + s.message());
  PTC_RETURN_IF_ERROR(s);
  return Consume(static_cast<const char*>(dst), n);
}

// Maps the window of the file that holds the next n bytes of the shard.
bool VerifyingShardReader::MapWindow(size_t n) {
  const uint64_t at = shard_.offset + pos_;
  if (map_ != nullptr && at >= map_begin_ && at + n <= map_begin_ + map_len_) return true;
  if (map_ != nullptr) ::munmap(map_, map_len_);
  map_ = nullptr;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = at / page * page;
  const uint64_t end =
      std::min<uint64_t>(shard_.offset + shard_.nbytes, std::max<uint64_t>(begin + kMapWindow, at + n));
  void* p = ::mmap(nullptr, end - begin, PROT_READ, MAP_SHARED | MAP_POPULATE, file_->fd(), static_cast<off_t>(begin));
  if (p == MAP_FAILED) {
    mappable_ = false;
    return false;
  }
  map_ = static_cast<char*>(p);
  map_begin_ = begin;
  map_len_ = end - begin;
  return true;
}

Result<const char*> VerifyingShardReader::Next(size_t n, char* scratch) {
  PTC_RETURN_IF_ERROR(CheckRange(n));
  if (!mappable_ || !MapWindow(n)) {
    PTC_RETURN_IF_ERROR(Read(n, scratch));
    return scratch;
  }
  const char* p = map_ + (shard_.offset + pos_ - map_begin_);
  PTC_RETURN_IF_ERROR(Consume(p, n));
  return p;
}

Status VerifyingShardReader::Finish() {
  if (pos_ != shard_.nbytes) {
    return CorruptionError(ShardLabel(shard_) + ": checksum not verified, " + std::to_string(pos_) + " of " +
                           std::to_string(shard_.nbytes) + " bytes read");
  }
  if (shard_.nbytes == 0 && block_ == 0) return EndBlock();  // the one empty block
  return Status::OK();
}

Status VerifyShardRange(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset, uint64_t n) {
  if (offset > shard.nbytes || n > shard.nbytes - offset) {
    return InvalidArgumentError(ShardLabel(shard) + ": range of " + std::to_string(n) + " bytes at " +
                                std::to_string(offset) + " leaves the shard of " + std::to_string(shard.nbytes) +
                                " bytes");
  }
  if (n == 0 && shard.nbytes > 0) return Status::OK();
  const size_t first = BlockOf(shard, offset);
  const uint64_t end = n == 0 ? 0 : BlockEnd(shard, BlockOf(shard, offset + n - 1));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<VerifyingShardReader> reader,
                       VerifyingShardReader::Open(env, store, shard, first));
  const size_t chunk = std::min<uint64_t>(kVerifyChunk, std::max<uint64_t>(end - reader->position(), 1));
  auto buf = std::make_unique_for_overwrite<char[]>(chunk);
  while (reader->position() < end) {
    PTC_RETURN_IF_ERROR(reader->Read(std::min<uint64_t>(chunk, end - reader->position()), buf.get()));
  }
  return end == shard.nbytes ? reader->Finish() : Status::OK();
}

Status VerifyShard(Env* env, const Store& store, const ShardRecord& shard) {
  return VerifyShardRange(env, store, shard, 0, shard.nbytes);
}

Status VerifyGeneration(const Store& store, const GenerationManifest& m, bool check_hdf5) {
  for (const ShardRecord& s : m.shards) {
    PTC_RETURN_IF_ERROR(VerifyShard(store.env(), store, s));
    const TensorRecord* t = FindTensor(m, s.tensor);
    if (check_hdf5 && t != nullptr) PTC_RETURN_IF_ERROR(CheckH5Shard(store.AbsPath(s.file), s, t->dtype));
  }
  return Status::OK();
}

}  // namespace ptc
