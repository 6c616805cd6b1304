// A Snapshot is what the mount serves at one moment: one parallel config
// over one committed generation, for the ranks of one worker. When the config
// changes before the store is rewritten, the new config's views are served
// from the old generation's shards (lazy layout); once the rewrite commits,
// a snapshot over the new generation replaces it.
//
// Open files hold their snapshot, so a file keeps serving the generation it
// was opened in. Thread safety: immutable but for the checksum cache, which
// is internally locked.
#pragma once

#include <time.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ptc/base/mutex.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/dataset/state.h"
#include "ptc/dataset/view.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store.h"
#include "ptc/store/store_reader.h"
#include "view/virtual_file.h"

namespace ptcfs {

// Which checksum blocks of which shards were verified, for the whole mount: a
// block of a shard (file, offset, size, checksum) is read once, whatever
// snapshot serves it, and only when a read first needs its bytes. A failure
// is kept for the shard, so a corrupt shard keeps failing.
// Thread safety: internally locked; a block may be verified twice when two
// threads first need it at once.
class ShardChecks {
 public:
  // Verifies the blocks holding bytes [offset, offset + n) of the shard that
  // were not yet. A block another thread is verifying is waited for, not read
  // again (the kernel's readahead sends several reads of one block at once).
  // `reader`, when given, is the reader the bytes are served through: blocks
  // are checked in its open file of the shard (ptc::VerifyShardRangeInFile:
  // hashed from a mapping, no copy); otherwise the file is opened and read.
  // \error as ptc::VerifyShardRange, or the shard's earlier failure.
  ptc::Status Check(const ptc::Store& store, const ptc::ShardRecord& shard, uint64_t offset, uint64_t n,
                    const ptc::GenerationReader* reader = nullptr) EXCLUDES(mu_);

 private:
  using Key = std::tuple<std::string, uint64_t, uint64_t, uint64_t>;
  enum class Block : uint8_t { kUnchecked, kChecking, kVerified };
  struct Entry {
    std::vector<Block> blocks;
    ptc::Status failure;
  };
  ptc::Mutex mu_;
  ptc::CondVar checked_{&mu_};  // signalled when blocks leave kChecking
  std::map<Key, Entry> shards_ GUARDED_BY(mu_);
};

class Snapshot {
 public:
  // `worker` < 0: all ranks. `dataset`: the dataset position served under
  // data/ (none: no data/ tree); `source` must be its opened source.
  // \error as ModelLayout::View.
  static ptc::Result<std::shared_ptr<const Snapshot>> Create(
      const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation, ptc::ModelLayout layout,
      int worker, std::shared_ptr<ShardChecks> checks, std::optional<ptc::DatasetState> dataset = std::nullopt,
      std::shared_ptr<const ptc::DatasetSource> source = nullptr);

  const ptc::Store& store() const { return store_; }
  const ptc::ModelLayout& layout() const { return layout_; }
  const ptc::ParallelConfig& config() const { return layout_.config(); }
  const ptc::ModelSpec& spec() const { return layout_.spec(); }
  uint64_t generation() const { return generation_->generation; }
  const std::vector<ptc::RankView>& views() const { return views_; }
  const ptc::GenerationReader& reader() const { return reader_; }
  // The copies of the generation's pieces in rank files, by piece (a record of reader().manifest()).
  const std::map<const ptc::ShardRecord*, std::vector<ptc::CopyPlace>>& copies() const { return copies_; }
  int WorkerOf(int rank) const { return config().WorkerOf(rank); }
  std::map<std::string, std::string> Metadata(int rank) const;
  const std::optional<ptc::DatasetState>& dataset() const { return dataset_; }
  // When the generation was committed (its manifest's mtime; the time the
  // snapshot was made if that cannot be read): the time of every file it serves.
  const struct timespec& commit_time() const { return commit_time_; }
  // The Megatron iteration and kept entries of the generation (ptc/checkpoint/megatron/megatron.h);
  // an error when its manifest's extra["megatron"] is malformed.
  ptc::Result<ptc::megatron::MegatronState> megatron() const;

  // The data view of data-parallel rank `dp_rank` (of length group `group`),
  // built on first use and shared by the ranks of that dp coordinate.
  // \error as RankSamplesFor.
  ptc::Result<std::shared_ptr<const ptc::RankDataView>> DataView(int dp_rank, std::optional<size_t> group) const
      EXCLUDES(mu_);

  // The checksums of the shard's blocks that hold [offset, offset + n), verified once per mount (ShardChecks),
  // in the file the snapshot serves the shard from.
  ptc::Status Check(const ptc::ShardRecord& shard, uint64_t offset, uint64_t n) const {
    return checks_->Check(store_, shard, offset, n, &reader_);
  }

 private:
  Snapshot(const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation, ptc::ModelLayout layout);

  const ptc::Store& store_;
  std::shared_ptr<const ptc::GenerationManifest> generation_;
  ptc::ModelLayout layout_;
  std::vector<ptc::RankView> views_;
  ptc::GenerationReader reader_;
  std::map<const ptc::ShardRecord*, std::vector<ptc::CopyPlace>> copies_;
  std::optional<ptc::DatasetState> dataset_;
  std::shared_ptr<const ptc::DatasetSource> source_;
  std::shared_ptr<ShardChecks> checks_;
  ptc::megatron::MegatronState megatron_;
  ptc::Status megatron_error_;
  struct timespec commit_time_ = {};
  mutable ptc::Mutex mu_;
  mutable std::map<std::pair<int, size_t>, std::shared_ptr<const ptc::RankDataView>> data_views_ GUARDED_BY(mu_);
};

}  // namespace ptcfs
