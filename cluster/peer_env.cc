#include "cluster/peer_env.h"

#include <algorithm>
#include <atomic>
#include <charconv>

#include "cluster/durable.h"
#include "ptc/base/checksum.h"
#include "ptc/store/store_layout.h"

namespace ptc::cluster {

// A shard file of another worker: reads go, block by block, through the env.
class PeerEnv::RemoteFile : public RandomAccessFile {
 public:
  RemoteFile(PeerEnv* env, std::string path, Target target)
      : env_(env), path_(std::move(path)), target_(std::move(target)) {
    for (const ShardRecord& r : target_.records) size_ = std::max(size_, r.offset + r.nbytes);
  }

  Status Read(uint64_t offset, size_t n, void* dst) const override {
    // A read that starts where this file's previous one ended is a step of a sweep.
    const bool sequential = next_.exchange(offset + n, std::memory_order_relaxed) == offset;
    char* out = static_cast<char*>(dst);
    while (n > 0) {
      const ShardRecord* record = RecordAt(offset);
      if (record == nullptr) {
        return NotFoundError(path_ + ": byte " + std::to_string(offset) + " is in no shard's data (worker " +
                             std::to_string(target_.records.front().worker) + " serves only those)");
      }
      const uint64_t in_shard = offset - record->offset;
      const size_t block = BlockOf(*record, in_shard);
      const uint64_t skip = in_shard - BlockBegin(*record, block);
      const uint64_t take = std::min<uint64_t>(n, BlockEnd(*record, block) - in_shard);
      PTC_RETURN_IF_ERROR(env_->ReadBlock(target_.peer, *record, block, skip, take, out, sequential));
      out += take;
      offset += take;
      n -= static_cast<size_t>(take);
    }
    return Status::OK();
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }
  bool VerifiesBlocks() const override { return true; }  // PeerClient checks every block on arrival

 private:
  const ShardRecord* RecordAt(uint64_t offset) const {
    for (const ShardRecord& r : target_.records) {
      if (offset >= r.offset && offset - r.offset < r.nbytes) return &r;
    }
    return nullptr;
  }

  PeerEnv* const env_;
  const std::string path_;
  const Target target_;
  uint64_t size_ = 0;
  mutable std::atomic<uint64_t> next_{UINT64_MAX};  // where the last read ended
};

PeerEnv::PeerEnv(Env* local, std::string root, PeerEnvOptions options)
    : local_(local),
      root_(root.ends_with('/') ? root : root + "/"),
      options_(std::move(options)),
      client_(options_.client) {}

void PeerEnv::SetPeers(std::map<int, PeerAddress> peers) {
  MutexLock lock(&mu_);
  peers_ = std::move(peers);
}

void PeerEnv::SetManifests(std::vector<std::shared_ptr<const GenerationManifest>> manifests) {
  MutexLock lock(&mu_);
  manifests_ = std::move(manifests);
}

void PeerEnv::SetCurrent(std::function<std::shared_ptr<const GenerationManifest>()> current) {
  MutexLock lock(&mu_);
  current_ = std::move(current);
}

PeerEnv::Stats PeerEnv::stats() const {
  MutexLock lock(&mu_);
  Stats s = stats_;
  s.connections = client_.pool_stats();
  return s;
}

int PeerEnv::RemoteWorker(const std::string& path) const {
  if (!path.starts_with(root_)) return -1;
  // gen-NNNNNN/worker-WW/NAME
  const std::string_view rel = std::string_view(path).substr(root_.size());
  const size_t a = rel.find('/');
  if (a == std::string_view::npos || !ParseGenerationDirName(rel.substr(0, a))) return -1;
  const size_t b = rel.find('/', a + 1);
  if (b == std::string_view::npos || b + 1 == rel.size()) return -1;
  std::string_view dir = rel.substr(a + 1, b - a - 1);
  constexpr std::string_view kPrefix = "worker-";
  if (!dir.starts_with(kPrefix)) return -1;
  dir.remove_prefix(kPrefix.size());
  int worker = -1;
  auto [end, ec] = std::from_chars(dir.data(), dir.data() + dir.size(), worker);
  if (ec != std::errc() || end != dir.data() + dir.size() || worker < 0 || WorkerDirName(worker) != rel.substr(a + 1, b - a - 1)) {
    return -1;
  }
  return worker == options_.self ? -1 : worker;
}

std::pair<Env*, std::string> PeerEnv::LocalPath(const std::string& path) const {
  if (options_.durable_dir.empty() || !path.starts_with(root_) ||
      !std::string_view(path).substr(root_.size()).starts_with(kDurablePrefix)) {
    return {local_, path};
  }
  return {options_.durable_env ? options_.durable_env.get() : local_,
          JoinPath(options_.durable_dir, std::string_view(path).substr(root_.size() + kDurablePrefix.size()))};
}

Result<PeerEnv::Target> PeerEnv::Lookup(int worker, const std::string& rel) const {
  std::function<std::shared_ptr<const GenerationManifest>()> current;
  std::vector<std::shared_ptr<const GenerationManifest>> manifests;
  Target t;
  {
    MutexLock lock(&mu_);
    auto peer = peers_.find(worker);
    if (peer == peers_.end()) {
      return IOError(root_ + rel + ": held by worker " + std::to_string(worker) +
                     ", which is not a live member of the job");
    }
    t.peer = peer->second;
    manifests = manifests_;
    current = current_;
  }
  if (current) manifests.push_back(current());
  for (const auto& m : manifests) {
    if (m == nullptr) continue;
    for (const ShardRecord& r : m->shards) {
      if (r.file != rel) continue;
      const bool known = std::any_of(t.records.begin(), t.records.end(),
                                     [&](const ShardRecord& x) { return x.offset == r.offset && x.nbytes == r.nbytes; });
      if (!known) t.records.push_back(r);
    }
  }
  if (t.records.empty()) return NotFoundError(root_ + rel + ": no served manifest names this file of worker " + std::to_string(worker));
  return t;
}

Result<std::unique_ptr<RandomAccessFile>> PeerEnv::OpenRead(const std::string& path) {
  const int worker = RemoteWorker(path);
  if (worker < 0) {
    auto [env, local] = LocalPath(path);
    return env->OpenRead(local);
  }
  PTC_ASSIGN_OR_RETURN(Target target, Lookup(worker, path.substr(root_.size())));
  return std::unique_ptr<RandomAccessFile>(new RemoteFile(this, path, std::move(target)));
}

bool PeerEnv::Exists(const std::string& path) {
  if (RemoteWorker(path) >= 0) return true;
  auto [env, local] = LocalPath(path);
  return env->Exists(local);
}

bool PeerEnv::Reachable(const std::string& path) {
  const int worker = RemoteWorker(path);
  if (worker < 0) return true;
  MutexLock lock(&mu_);
  return peers_.count(worker) > 0;
}

Result<uint64_t> PeerEnv::FileSize(const std::string& path) {
  const int worker = RemoteWorker(path);
  if (worker < 0) {
    auto [env, local] = LocalPath(path);
    return env->FileSize(local);
  }
  PTC_ASSIGN_OR_RETURN(auto file, OpenRead(path));
  return file->Size();
}

PeerEnv::~PeerEnv() {
  std::vector<std::thread> fetchers;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (AheadJob& job : ahead_jobs_) {  // never fetched: no reader may wait on them
      job.span->status = FailedPreconditionError("peer env closing");
      job.span->ready = true;
      cache_.remove(job.span);
    }
    ahead_in_flight_ -= ahead_jobs_.size();
    ahead_jobs_.clear();
    arrived_.SignalAll();
    fetchers.swap(fetchers_);
    work_.SignalAll();
  }
  for (std::thread& t : fetchers) t.join();
}

std::shared_ptr<char[]> PeerEnv::SpanBuffer() {
  {
    MutexLock lock(&mu_);
    if (!free_.empty()) {
      std::shared_ptr<char[]> b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  return std::make_shared_for_overwrite<char[]>(std::max<size_t>(1, options_.span_blocks) * kChecksumBlockBytes);
}

std::shared_ptr<PeerEnv::Span> PeerEnv::FindSpan(const ShardRecord& record, size_t block) {
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    const Span& c = **it;
    if (c.first <= block && block < c.end && c.offset == record.offset && c.file == record.file) {
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front();
    }
  }
  return nullptr;
}

std::shared_ptr<PeerEnv::Span> PeerEnv::AddSpan(const ShardRecord& record, size_t first, bool ahead) {
  auto span = std::make_shared<Span>();
  span->file = record.file;
  span->offset = record.offset;
  span->first = first;
  span->end = std::min(BlockCount(record), first + std::max<size_t>(1, options_.span_blocks));
  span->begin = BlockBegin(record, first);
  span->ahead = ahead;
  cache_.push_front(span);
  return span;
}

void PeerEnv::Trim() {
  size_t ready = 0;
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (!(*it)->ready || ++ready <= options_.cached_spans) {
      ++it;
      continue;
    }
    // Kept for the next fetch when no reader holds it (nor its span, whose
    // bytes a reader takes once it is ready): a fresh 16 MiB buffer is faulted
    // in and zeroed page by page.
    if (it->use_count() == 1 && (*it)->bytes.use_count() == 1 && free_.size() < options_.cached_spans) {
      free_.push_back(std::move((*it)->bytes));
    }
    it = cache_.erase(it);
  }
}

void PeerEnv::MaybeAhead(const PeerAddress& peer, const ShardRecord& record, const Span& span) {
  if (options_.ahead_spans == 0 || stopping_ || span.end >= BlockCount(record) ||
      ahead_in_flight_ >= options_.ahead_spans || FindSpan(record, span.end) != nullptr) {
    return;
  }
  ahead_jobs_.push_back({peer, record, AddSpan(record, span.end, /*ahead=*/true)});
  ++ahead_in_flight_;
  stats_.ahead++;
  if (fetchers_.size() < options_.ahead_spans) fetchers_.emplace_back([this] { AheadLoop(); });
  work_.SignalAll();
}

void PeerEnv::AheadLoop() {
  for (;;) {
    AheadJob job;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && ahead_jobs_.empty()) work_.Wait();
      if (stopping_) return;
      job = std::move(ahead_jobs_.front());
      ahead_jobs_.pop_front();
    }
    Fill(job.peer, job.record, job.span);
  }
}

void PeerEnv::Fill(const PeerAddress& peer, const ShardRecord& record, const std::shared_ptr<Span>& span) {
  std::shared_ptr<char[]> bytes = SpanBuffer();
  const uint64_t end = BlockEnd(record, span->end - 1);
  Status s = client_.ReadShardRange(peer, record, span->begin, end - span->begin, bytes.get());
  MutexLock lock(&mu_);
  span->status = s;
  span->ready = true;
  if (span->ahead) {
    --ahead_in_flight_;  // with `ready`: a reader woken by this span may have the next one fetched at once
    stats_.ahead_failed += s.ok() ? 0 : 1;
  }
  if (s.ok()) {
    span->bytes = std::move(bytes);
    stats_.requests++;
    stats_.bytes += end - span->begin;
  } else {
    cache_.remove(span);
    if (free_.size() < options_.cached_spans) free_.push_back(std::move(bytes));
  }
  Trim();
  arrived_.SignalAll();
}

Status PeerEnv::ReadBlock(const PeerAddress& peer, const ShardRecord& record, size_t block, uint64_t skip, uint64_t n,
                          char* dst, bool sequential) {
  std::shared_ptr<Span> span;
  bool mine = false;
  {
    MutexLock lock(&mu_);
    span = FindSpan(record, block);
    if (span != nullptr) {
      stats_.cache_hits++;
    } else {
      span = AddSpan(record, block, /*ahead=*/false);
      mine = true;
    }
    if (sequential) MaybeAhead(peer, record, *span);
  }
  if (mine) Fill(peer, record, span);
  Status status;
  std::shared_ptr<const char[]> bytes;  // held: a span dropped from the cache meanwhile keeps its buffer
  {
    MutexLock lock(&mu_);
    while (!span->ready) arrived_.Wait();
    status = span->status;
    bytes = span->bytes;
  }
  if (!status.ok() && (span->ahead || span->end > block + 1)) {
    // Fetched ahead, or a span beyond this block: the block asked for alone
    // (a bad block after it is not this read's).
    {
      MutexLock lock(&mu_);
      span = AddSpan(record, block, /*ahead=*/false);
      span->end = block + 1;
    }
    Fill(peer, record, span);
    MutexLock lock(&mu_);
    status = span->status;
    bytes = span->bytes;
  }
  PTC_RETURN_IF_ERROR(status);
  std::copy_n(bytes.get() + (BlockBegin(record, block) - span->begin) + skip, n, dst);
  return Status::OK();
}

}  // namespace ptc::cluster
