#include "view/snapshot.h"

#include <sys/stat.h>

#include <algorithm>

#include "ptc/store/shard_verify.h"
#include "view/rank_files.h"

namespace ptcfs {

Snapshot::Snapshot(const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                   ptc::ModelLayout layout)
    : store_(store),
      generation_(generation),
      layout_(std::move(layout)),
      reader_(store, generation, /*verify=*/false),
      copies_(generation ? ptc::CopiesByPiece(*generation)
                         : std::map<const ptc::ShardRecord*, std::vector<ptc::CopyPlace>>{}) {}

ptc::Result<std::shared_ptr<const Snapshot>> Snapshot::Create(const ptc::Store& store,
                                                              std::shared_ptr<const ptc::GenerationManifest> generation,
                                                              ptc::ModelLayout layout, int worker,
                                                              std::shared_ptr<ShardChecks> checks,
                                                              std::optional<ptc::DatasetState> dataset,
                                                              std::shared_ptr<const ptc::DatasetSource> source) {
  if (dataset && !source) return ptc::InternalError("a snapshot with a dataset needs its source");
  std::shared_ptr<Snapshot> s(new Snapshot(store, std::move(generation), std::move(layout)));
  s->dataset_ = std::move(dataset);
  s->source_ = std::move(source);
  s->checks_ = std::move(checks);
  const std::string manifest = store.ManifestPath(s->generation());
  struct stat st;
  if (::stat(manifest.c_str(), &st) == 0) {
    s->commit_time_ = st.st_mtim;
  } else {
    ::clock_gettime(CLOCK_REALTIME, &s->commit_time_);
  }
  auto megatron = ptc::megatron::LoadMegatronState(s->generation_->extra, manifest);
  if (megatron.ok()) {
    s->megatron_ = std::move(megatron).value();
  } else {
    s->megatron_error_ = megatron.status();
  }
  const ptc::ParallelConfig& config = s->config();
  for (int rank = 0; rank < config.world_size(); ++rank) {
    if (worker >= 0 && config.WorkerOf(rank) != worker) continue;
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, s->layout_.View(rank));
    s->views_.push_back(std::move(view));
  }
  return std::shared_ptr<const Snapshot>(std::move(s));
}

std::map<std::string, std::string> Snapshot::Metadata(int rank) const { return SafetensorsMetadata(config(), rank); }

ptc::Result<ptc::megatron::MegatronState> Snapshot::megatron() const {
  if (!megatron_error_.ok()) return megatron_error_;
  return megatron_;
}

ptc::Result<std::shared_ptr<const ptc::RankDataView>> Snapshot::DataView(int dp_rank,
                                                                         std::optional<size_t> group) const {
  if (!dataset_) return ptc::NotFoundError("the store holds no dataset");
  const std::pair<int, size_t> key{dp_rank, group.value_or(0)};
  {
    ptc::MutexLock lock(&mu_);
    if (auto it = data_views_.find(key); it != data_views_.end()) return it->second;
  }
  // Built outside the lock (grouped streams read every remaining length); a
  // concurrent first use may build twice, and the first one stored wins.
  PTC_ASSIGN_OR_RETURN(auto samples, ptc::RankSamplesFor(*dataset_, source_, config().dp, dp_rank, group));
  auto view = std::make_shared<const ptc::RankDataView>(source_, std::move(samples));
  ptc::MutexLock lock(&mu_);
  return data_views_.emplace(key, std::move(view)).first->second;
}

namespace {

// Checks bytes [begin, begin + n) of the shard (whole blocks) in `reader`'s
// open file of it when there is one; a file it cannot open is opened again
// from the store, which reports why.
ptc::Status Verify(const ptc::Store& store, const ptc::ShardRecord& shard, uint64_t begin, uint64_t n,
                   const ptc::GenerationReader* reader) {
  if (reader != nullptr) {
    if (auto file = reader->File(shard); file.ok()) return ptc::VerifyShardRangeInFile(**file, shard, begin, n);
  }
  return ptc::VerifyShardRange(store.env(), store, shard, begin, n);
}

}  // namespace

ptc::Status ShardChecks::Check(const ptc::Store& store, const ptc::ShardRecord& shard, uint64_t offset, uint64_t n,
                               const ptc::GenerationReader* reader) {
  if (n == 0 || offset >= shard.nbytes) return ptc::Status::OK();
  n = std::min(n, shard.nbytes - offset);
  const size_t first = ptc::BlockOf(shard, offset), last = ptc::BlockOf(shard, offset + n - 1);
  const Key key{shard.file, shard.offset, shard.nbytes, shard.checksum};
  ptc::MutexLock lock(&mu_);
  Entry& e = shards_[key];  // map nodes stay where they are
  if (e.blocks.empty()) e.blocks.resize(ptc::BlockCount(shard), Block::kUnchecked);
  while (true) {
    if (!e.failure.ok()) return e.failure;
    // The unchecked blocks of the range (as one range to verify) and whether
    // another thread is checking one.
    size_t lo = last + 1, hi = first;
    bool others = false;
    for (size_t b = first; b <= last; ++b) {
      if (e.blocks[b] == Block::kUnchecked) lo = std::min(lo, b), hi = std::max(hi, b);
      others = others || e.blocks[b] == Block::kChecking;
    }
    if (lo > hi) {
      if (!others) return ptc::Status::OK();
      checked_.Wait();
      continue;
    }
    std::vector<size_t> claimed;
    for (size_t b = lo; b <= hi; ++b) {
      if (e.blocks[b] == Block::kUnchecked) e.blocks[b] = Block::kChecking, claimed.push_back(b);
    }
    const uint64_t begin = ptc::BlockBegin(shard, lo);
    mu_.Unlock();
    ptc::Status s = Verify(store, shard, begin, ptc::BlockEnd(shard, hi) - begin, reader);
    mu_.Lock();
    for (size_t b : claimed) e.blocks[b] = s.ok() ? Block::kVerified : Block::kUnchecked;
    if (!s.ok()) e.failure = s;
    checked_.SignalAll();
  }
}

}  // namespace ptcfs
