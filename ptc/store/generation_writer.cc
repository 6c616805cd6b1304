// Writing a generation: shard files, then the commit.
#include "ptc/store/generation_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include "ptc/store/h5shard.h"
#include "ptc/store/store_layout.h"

namespace ptc {
namespace {

// Starts writing a finished shard file's dirty pages to disk without waiting
// for them (sync_file_range SYNC_FILE_RANGE_WRITE), so that the disk works
// while later shards are assembled and the syncfs at Commit finds little left
// to do (measured: most of that syncfs overlaps the copy). A hint that moves no
// bytes, so it goes to the OS directly, as HDF5 does (a Store's files are on
// the real filesystem, see store.h); failures are ignored: Commit's syncfs is
// what makes the data durable.
void StartWriteback(const std::string& path) {
#ifdef SYNC_FILE_RANGE_WRITE
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // never waits (a FIFO put in its place)
  if (fd < 0) return;
  (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  ::close(fd);
#endif
}

}  // namespace

ShardSink::ShardSink(std::string abs_path, ShardRecord record, std::unique_ptr<WritableFile> file,
                     std::vector<CopyTarget> copies)
    : abs_path_(std::move(abs_path)), record_(std::move(record)), file_(std::move(file)), copies_(std::move(copies)) {}
ShardSink::~ShardSink() = default;

Status ShardSink::Append(const void* data, size_t n) {
  if (finished_) return FailedPreconditionError(record_.file + ": append after Finish");
  if (n > record_.nbytes - written_) {
    return InvalidArgumentError(record_.file + ": writing " + std::to_string(written_ + n) + " bytes into a shard of " +
                                std::to_string(record_.nbytes) + " (tensor '" + record_.tensor + "')");
  }
  if (file_) PTC_RETURN_IF_ERROR(file_->PWrite(record_.offset + written_, data, n));
  for (CopyTarget& c : copies_) PTC_RETURN_IF_ERROR(c.file->PWrite(c.offset + written_, data, n));
  if (!adopted_) {
    hash_.Update(data, n);
  } else if (adopted_->crc32s.empty()) {
    adopted_crcs_.Update(data, n);  // a source recorded before block CRC-32s
  }
  written_ += n;
  return Status::OK();
}

Status ShardSink::AdoptChecksums(const ShardRecord& source) {
  if (written_ != 0 || finished_) return FailedPreconditionError(record_.file + ": checksums adopted after an append");
  if (source.nbytes != record_.nbytes) {
    return FailedPreconditionError(record_.file + ": adopting the checksums of " + source.file + " (" +
                                   std::to_string(source.nbytes) + " bytes) for a shard of " +
                                   std::to_string(record_.nbytes));
  }
  adopted_ = ShardDigest{source.checksum, source.block_checksums, source.block_crc32s};
  return Status::OK();
}

Result<ShardRecord> ShardSink::Finish() {
  if (finished_) return FailedPreconditionError(record_.file + ": Finish called twice");
  if (written_ != record_.nbytes) {
    return FailedPreconditionError(record_.file + ": " + std::to_string(written_) + " of " +
                                   std::to_string(record_.nbytes) + " bytes written (tensor '" + record_.tensor + "')");
  }
  // Not synced here: Commit makes all shard files durable at once (SyncFileSystem).
  if (file_) PTC_RETURN_IF_ERROR(file_->Close());
  for (CopyTarget& c : copies_) PTC_RETURN_IF_ERROR(c.file->Close());
  finished_ = true;
  if (file_) StartWriteback(abs_path_);
  for (const CopyTarget& c : copies_) StartWriteback(c.abs_path);
  ShardDigest digest = adopted_ ? std::move(*adopted_) : hash_.Finish();
  record_.checksum = digest.checksum;
  record_.block_checksums = std::move(digest.blocks);
  record_.block_crc32s = digest.crc32s.empty() ? adopted_crcs_.Finish() : std::move(digest.crc32s);
  return record_;
}

GenerationWriter::GenerationWriter(Store* store, uint64_t generation)
    : store_(store), generation_(generation), dir_(GenerationDirName(generation)) {}

GenerationWriter::~GenerationWriter() {
  if (!committed_) (void)store_->env()->RemoveTree(store_->AbsPath(dir_));
  store_->WriterDone(committed_ ? 0 : generation_);
}

Result<std::string> GenerationWriter::WorkerDir(int worker) {
  if (committed_ || aborted_) return FailedPreconditionError(dir_ + ": generation already committed or aborted");
  if (worker < 0) return InvalidArgumentError(dir_ + ": negative worker " + std::to_string(worker));
  const std::string worker_dir = JoinPath(dir_, WorkerDirName(worker));
  // Created under the lock: a concurrent caller for the same worker must not
  // create its file before the directory exists.
  MutexLock lock(&mu_);
  if (!workers_.count(worker)) {
    PTC_RETURN_IF_ERROR(store_->env()->CreateDirs(store_->AbsPath(worker_dir)));
    workers_.insert(worker);
  }
  return worker_dir;
}

Status GenerationWriter::AdoptFile(const std::string& src, int worker, const std::string& name) {
  PTC_ASSIGN_OR_RETURN(const std::string worker_dir, WorkerDir(worker));
  PTC_RETURN_IF_ERROR(CheckEntryName(worker_dir, name));
  if (name.ends_with(".h5") || name.ends_with(".safetensors")) {
    return InvalidArgumentError(JoinPath(worker_dir, name) + ": the name of the store's own files");
  }
  MutexLock lock(&mu_);  // AdoptFile and NewShardIn of one name are ordered
  if (adopted_.count({worker, name})) return InvalidArgumentError(JoinPath(worker_dir, name) + ": adopted twice");
  PTC_RETURN_IF_ERROR(store_->env()->Link(src, store_->AbsPath(JoinPath(worker_dir, name))));
  adopted_.insert({worker, name});
  return Status::OK();
}

Result<std::unique_ptr<ShardSink>> GenerationWriter::NewShardIn(const std::string& tensor, DType dtype,
                                                                std::vector<Box> boxes, int worker,
                                                                const std::string& name, uint64_t offset) {
  {
    MutexLock lock(&mu_);
    if (!adopted_.count({worker, name})) {
      return FailedPreconditionError(dir_ + ": '" + name + "' of worker " + std::to_string(worker) + " not adopted");
    }
  }
  ShardRecord record;
  PTC_ASSIGN_OR_RETURN(std::string abs, PrepareShardFile(tensor, dtype, boxes, worker, record, {{name, offset}}));
  PTC_ASSIGN_OR_RETURN(const uint64_t size, store_->env()->FileSize(abs));
  if (offset > size || record.nbytes > size - offset) {
    return InvalidArgumentError(record.file + ": tensor '" + tensor + "' (" + std::to_string(record.nbytes) +
                                " bytes at " + std::to_string(offset) + ") past its end (" + std::to_string(size) +
                                " bytes)");
  }
  return std::unique_ptr<ShardSink>(new ShardSink(std::move(abs), std::move(record), nullptr, {}));
}

Result<std::string> GenerationWriter::PrepareShardFile(const std::string& tensor, DType dtype,
                                                       const std::vector<Box>& boxes, int worker, ShardRecord& record,
                                                       std::optional<std::pair<std::string, uint64_t>> in) {
  if (worker < 0) return InvalidArgumentError("tensor '" + tensor + "': negative worker " + std::to_string(worker));
  PTC_ASSIGN_OR_RETURN(const std::string worker_dir, WorkerDir(worker));
  const std::string stem = SanitizeFileName(tensor);
  int k;
  {
    MutexLock lock(&mu_);
    k = counters_[{stem, worker}]++;
  }
  record.tensor = tensor;
  record.boxes = boxes;
  record.worker = worker;
  record.file = JoinPath(worker_dir, stem + ".s" + std::to_string(k) + ".h5");
  record.nbytes = 0;
  for (const Box& b : boxes) record.nbytes += static_cast<uint64_t>(b.volume()) * DTypeSize(dtype);
  if (in) {  // an adopted file holds the bytes; the HDF5 file describes them there
    record.h5 = record.file;
    record.file = JoinPath(worker_dir, in->first);
    record.offset = in->second;
    PTC_RETURN_IF_ERROR(CreateH5ExternalShard(store_->AbsPath(record.h5), dtype, boxes, tensor, in->first, in->second));
    return store_->AbsPath(record.file);
  }
  if (auto placed = PlacementOf(tensor, boxes, worker); placed && record.nbytes > 0) {
    // The bytes go into a rank file; the HDF5 file describes them there.
    std::string name;
    {
      MutexLock lock(&mu_);
      name = rank_files_[placed->first].name;
    }
    PTC_RETURN_IF_ERROR(EnsureRankFile(placed->first));
    record.h5 = record.file;
    record.file = JoinPath(worker_dir, name);
    record.offset = placed->second;
    PTC_RETURN_IF_ERROR(CreateH5ExternalShard(store_->AbsPath(record.h5), dtype, boxes, tensor, name, record.offset));
    return store_->AbsPath(record.file);
  }
  const std::string abs = store_->AbsPath(record.file);
  PTC_ASSIGN_OR_RETURN(record.offset, CreateH5Shard(abs, dtype, boxes, tensor));
  return abs;
}

void GenerationWriter::SetRankFiles(std::vector<RankFileSpec> files) {
  MutexLock lock(&mu_);
  placements_.clear();
  copies_.clear();
  for (size_t i = 0; i < files.size(); ++i) {
    for (const RankFileSpec::Placement& p : files[i].placements) {
      placements_[{files[i].worker, p.tensor, p.boxes}] = {i, p.offset};
    }
    for (const RankFileSpec::Placement& c : files[i].copies) {
      copies_[{files[i].worker, c.tensor, c.boxes}].emplace_back(i, c.offset);
    }
  }
  rank_file_made_.assign(files.size(), false);
  rank_files_ = std::move(files);
}

std::optional<std::pair<size_t, uint64_t>> GenerationWriter::PlacementOf(const std::string& tensor,
                                                                         const std::vector<Box>& boxes,
                                                                         int worker) const {
  MutexLock lock(&mu_);
  auto it = placements_.find({worker, tensor, boxes});
  if (it == placements_.end()) return std::nullopt;
  return it->second;
}

Status GenerationWriter::EnsureRankFile(size_t index) {
  // Under mu_: a concurrent NewShard into the same file must find it made
  // (files are few and small to start: a header and a hole).
  MutexLock lock(&mu_);
  if (rank_file_made_[index]) return Status::OK();
  const RankFileSpec& f = rank_files_[index];
  const std::string rel = JoinPath(JoinPath(dir_, WorkerDirName(f.worker)), f.name);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, store_->env()->OpenWrite(store_->AbsPath(rel)));
  if (f.size > 0) {
    const char zero = 0;  // the file's length; the rest stays a hole until shards fill it
    PTC_RETURN_IF_ERROR(file->PWrite(f.size - 1, &zero, 1));
  }
  for (const RankFileSpec::Literal& l : f.literals) {
    PTC_RETURN_IF_ERROR(file->PWrite(l.offset, l.bytes.data(), l.bytes.size()));
  }
  PTC_RETURN_IF_ERROR(file->Close());
  rank_file_made_[index] = true;
  return Status::OK();
}

Result<std::vector<std::pair<std::string, uint64_t>>> GenerationWriter::PrepareCopies(const ShardRecord& record) {
  std::vector<std::pair<size_t, uint64_t>> wanted;
  {
    MutexLock lock(&mu_);
    auto it = copies_.find({record.worker, record.tensor, record.boxes});
    if (it == copies_.end() || record.nbytes == 0) return std::vector<std::pair<std::string, uint64_t>>{};
    wanted = it->second;
  }
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [index, offset] : wanted) {
    PTC_RETURN_IF_ERROR(EnsureRankFile(index));
    std::string name;
    {
      MutexLock lock(&mu_);
      name = rank_files_[index].name;
    }
    out.emplace_back(store_->AbsPath(JoinPath(JoinPath(dir_, WorkerDirName(record.worker)), name)), offset);
  }
  return out;
}

Result<std::unique_ptr<ShardSink>> GenerationWriter::NewShard(const std::string& tensor, DType dtype,
                                                              std::vector<Box> boxes, int worker) {
  ShardRecord record;
  PTC_ASSIGN_OR_RETURN(std::string abs, PrepareShardFile(tensor, dtype, boxes, worker, record));
  PTC_ASSIGN_OR_RETURN(auto wanted, PrepareCopies(record));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, store_->env()->OpenExisting(abs));
  std::vector<ShardSink::CopyTarget> copies;
  for (auto& [path, offset] : wanted) {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, store_->env()->OpenExisting(path));
    copies.push_back({std::move(path), std::move(f), offset});
  }
  return std::unique_ptr<ShardSink>(
      new ShardSink(std::move(abs), std::move(record), std::move(file), std::move(copies)));
}

std::vector<RankFileCopies> GenerationWriter::CopiesToCommit(const GenerationManifest& meta) const {
  using Key = std::tuple<int, std::string, std::vector<Box>>;
  auto previous = store_->CurrentSnapshot();  // before mu_: the store's lock is never taken under it
  std::map<Key, const ShardRecord*> mine;
  MutexLock lock(&mu_);
  for (const ShardRecord& s : shards_) mine.emplace(Key{s.worker, s.tensor, s.boxes}, &s);
  std::vector<RankFileCopies> out;
  // The caller's copies (the current generation's): kept where their piece is the same record.
  std::map<Key, const ShardRecord*> before;
  if (previous) {
    for (const ShardRecord& s : previous->shards) before.emplace(Key{s.worker, s.tensor, s.boxes}, &s);
  }
  for (const RankFileCopies& f : meta.rank_file_copies) {
    RankFileCopies kept{f.file, f.worker, {}};
    for (const CopyRecord& c : f.copies) {
      const Key key{f.worker, c.tensor, c.boxes};
      auto now = mine.find(key);
      auto then = before.find(key);
      if (now != mine.end() && then != before.end() && *now->second == *then->second) kept.copies.push_back(c);
    }
    if (!kept.copies.empty()) out.push_back(std::move(kept));
  }
  // The copies this writer wrote: those of every piece written here.
  const std::string prefix = dir_ + "/";
  for (const RankFileSpec& f : rank_files_) {
    RankFileCopies written{JoinPath(JoinPath(dir_, WorkerDirName(f.worker)), f.name), f.worker, {}};
    for (const RankFileSpec::Placement& c : f.copies) {
      auto it = mine.find(Key{f.worker, c.tensor, c.boxes});
      if (it == mine.end() || it->second->nbytes == 0 || !it->second->file.starts_with(prefix)) continue;
      written.copies.push_back({c.tensor, c.boxes, c.offset});
    }
    if (!written.copies.empty()) out.push_back(std::move(written));
  }
  return out;
}

void GenerationWriter::AddShard(ShardRecord record) {
  MutexLock lock(&mu_);
  shards_.push_back(std::move(record));
}

std::vector<ShardRecord> GenerationWriter::Shards() const {
  MutexLock lock(&mu_);
  return shards_;
}

std::vector<ShardRecord> GenerationWriter::Written() const {
  const std::string prefix = dir_ + "/";
  MutexLock lock(&mu_);
  std::vector<ShardRecord> out;
  for (const ShardRecord& s : shards_) {
    if (s.file.starts_with(prefix)) out.push_back(s);
  }
  return out;
}

// Syncs the shard directories, then writes gen-NNNNNN/manifest.json.
Status GenerationWriter::WriteGeneration(std::string_view manifest_text) {
  Env* env = store_->env();
  std::set<int> workers;
  {
    MutexLock lock(&mu_);
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
  const std::string text = EncodeRootManifest(generation_);
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
  meta.rank_file_copies = CopiesToCommit(meta);
  {
    MutexLock lock(&mu_);
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
  for (size_t i = 0; s.ok() && i < meta.rank_file_copies.size(); ++i) {
    const std::string& file = meta.rank_file_copies[i].file;
    if (!store_->env()->Exists(store_->AbsPath(file)))
      s = NotFoundError(label + ": rank file " + file + " does not exist");
  }
  if (s.ok()) s = WriteGeneration(text);
  if (s.ok()) s = SwitchRoot();
  if (committed_) {
    // Past the commit point: the marker only tells leftovers apart (GC removes it if this fails).
    (void)store_->env()->Remove(store_->AbsPath(JoinPath(dir_, kUncommittedMarker)));
    store_->SetCurrent(std::make_shared<const GenerationManifest>(std::move(checked).value()));
  }
  if (!committed_) {
    aborted_ = true;
    (void)store_->env()->RemoveTree(store_->AbsPath(dir_));
  }
  return s;
}

}  // namespace ptc
