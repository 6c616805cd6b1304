// Virtual files without FUSE: a rank's safetensors file rendered from a store
// in another parallel layout (lazy and strided extents) is read at random
// offsets and lengths, sequentially, from two threads at once, and through the
// zero-copy ranges it offers; every byte must equal the synth checkpoint of
// that layout.
#include "view/virtual_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "test_util.h"
#include "view/snapshot.h"

namespace ptcfs {
namespace {

using ptc::testing::Slurp;
using ptc::testing::Spec;
using ptc::testing::TempDir;

struct Rendered {
  std::unique_ptr<VirtualFile> file;
  std::string reference;
};

class VirtualFileTest : public ::testing::Test {
 protected:
  // Imports `from` into a store and opens its generation in layout `to`.
  void SetUpStore(const ptc::ModelSpec& spec, const std::string& from, const std::string& to) {
    snap_.reset();
    store_.reset();
    tmp_ = std::make_unique<TempDir>();
    const TempDir& tmp = *tmp_;
    ptc::Env* env = ptc::Env::Default();
    spec_ = spec;
    from_ = *ptc::ParseConfig(from);
    to_ = *ptc::ParseConfig(to);
    ASSERT_TRUE(ptc::WriteSynthCheckpoint(env, ptc::testing::FitLayout(spec, from_), 5, tmp / "src").ok());
    auto imported = ptc::ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, from_);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    ASSERT_TRUE(ptc::WriteSynthCheckpoint(env, ptc::testing::FitLayout(spec, to_), 5, tmp / "ref").ok());
    auto store = ptc::Store::Open(env, tmp / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    auto snap = Snapshot::Create(*store_, store_->CurrentSnapshot(), ptc::testing::FitLayout(spec_, to_), -1,
                                 std::make_shared<ShardChecks>());
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    snap_ = *snap;
  }

  // Rank `rank`'s model or optimizer file, and the synth file it must equal.
  Rendered Render(int rank, bool optim) {
    const ptc::RankView& view = snap_->views()[rank];
    auto file = MakeSafetensorsFile(snap_->reader(), optim ? view.optim : view.model, snap_->Metadata(rank),
                                    to_.WorkerOf(rank));
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    char dir[32];
    std::snprintf(dir, sizeof dir, "ref/rank-%05d/", rank);
    return {std::move(file).value(), Slurp(*tmp_ / (std::string(dir) + (optim ? "optim" : "model") + ".safetensors"))};
  }

  // Checks each shard range as the mount does, and that it lies in its shard.
  ShardCheck Check() {
    return [this](const ptc::ShardRecord& shard, uint64_t offset, uint64_t n) {
      EXPECT_LE(offset + n, shard.nbytes) << shard.tensor;
      return snap_->Check(shard, offset, n);
    };
  }

  // Random reads, a sequential pass in 512 KiB pieces, and the zero-copy ranges.
  void ExpectReadsMatch(const Rendered& r, std::mt19937_64& rng) {
    const VirtualFile& f = *r.file;
    ASSERT_EQ(f.size(), r.reference.size());
    std::string buf;
    for (int i = 0; i < 300; ++i) {
      const uint64_t offset = rng() % (f.size() + 10);
      const size_t n = rng() % 3 == 0 ? rng() % 64 : rng() % (600 << 10);
      buf.assign(n, '\0');
      auto got = f.Read(offset, n, buf.data(), Check());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const size_t want = offset >= f.size() ? 0 : std::min<uint64_t>(n, f.size() - offset);
      ASSERT_EQ(*got, want) << "read of " << n << " at " << offset;
      if (want == 0) continue;
      ASSERT_TRUE(buf.compare(0, want, r.reference, offset, want) == 0) << "read of " << n << " at " << offset;

      VirtualFile::FdRange range = f.SingleShardRange(offset, n);
      if (range.fd < 0) continue;
      ASSERT_NE(range.shard, nullptr);
      ASSERT_EQ(::pread(range.fd, buf.data(), want, static_cast<off_t>(range.position)), static_cast<ssize_t>(want));
      ASSERT_TRUE(buf.compare(0, want, r.reference, offset, want) == 0) << "fd range of " << n << " at " << offset;
      ++fd_ranges_;
    }
    std::string all;
    buf.resize(512 << 10);
    for (uint64_t offset = 0; offset < f.size(); offset += buf.size()) {
      auto got = f.Read(offset, buf.size(), buf.data(), Check());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      all.append(buf, 0, *got);
    }
    EXPECT_TRUE(all == r.reference);
  }

  std::unique_ptr<TempDir> tmp_;  // before store_ and snap_: removed after them
  ptc::ModelSpec spec_;
  ptc::ParallelConfig from_, to_;
  std::unique_ptr<ptc::Store> store_;
  std::shared_ptr<const Snapshot> snap_;
  int fd_ranges_ = 0;
};

// tp=2 -> tp=4 splits each stored column slice again (strided extents);
// tp=2 -> tp=1 joins two stored slices per row.
TEST_F(VirtualFileTest, LazyLayoutsReadLikeTheirSynthCheckpoint) {
  const ptc::ModelSpec spec = Spec("megatron-gpt", "layers=4,hidden=64,heads=4,vocab=256,seq=32", ptc::DType::kBF16,
                                   /*optimizer=*/true);
  std::mt19937_64 rng(ptc::testing::TestSeed());
  for (const char* to : {"tp=4,pp=1", "tp=1,pp=2,pp_layers=3+1", "tp=2,pp=2,dp=2,zero=1"}) {
    SCOPED_TRACE(to);
    SetUpStore(spec, "tp=2,pp=2", to);
    for (int rank = 0; rank < to_.world_size(); ++rank) {
      for (bool optim : {false, true}) {
        SCOPED_TRACE("rank " + std::to_string(rank) + (optim ? " optim" : " model"));
        ExpectReadsMatch(Render(rank, optim), rng);
      }
    }
  }
  EXPECT_GT(fd_ranges_, 0);  // the zero-copy path was taken and checked
}

// Two threads reading one file at once build each tensor's extents once and
// both get the right bytes.
TEST_F(VirtualFileTest, ConcurrentFirstReads) {
  SetUpStore(Spec("llama", "layers=2,hidden=64,heads=4,kv_heads=4,vocab=128,seq=16,ffn=96"), "tp=2,pp=1", "tp=4,pp=1");
  for (int round = 0; round < 5; ++round) {
    Rendered r = Render(round % 4, false);
    std::vector<std::string> out(2, std::string(r.reference.size(), '\0'));
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        // The two threads walk the file in opposite orders, 4 KiB at a time.
        const uint64_t step = 4096, pieces = (r.file->size() + step - 1) / step;
        for (uint64_t i = 0; i < pieces; ++i) {
          const uint64_t offset = (t == 0 ? i : pieces - 1 - i) * step;
          auto got = r.file->Read(offset, step, out[t].data() + offset, Check());
          ASSERT_TRUE(got.ok()) << got.status().ToString();
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_TRUE(out[0] == r.reference);
    EXPECT_TRUE(out[1] == r.reference);
  }
}

// A file of rows woven from two runs of a shard file (DCP's torchtitan keys:
// each head's rows alternate between its two halves) reads right at any
// offset, and as the two runs, not a pread per row: with one-piece extents and
// with the pairs Normalize makes of them.
class CountingFile final : public ptc::RandomAccessFile {
 public:
  explicit CountingFile(std::string data) : data_(std::move(data)) {}
  ptc::Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset > data_.size() || n > data_.size() - offset) return ptc::CorruptionError("read past the end");
    ++reads;
    std::memcpy(dst, data_.data() + offset, n);
    return ptc::Status::OK();
  }
  uint64_t Size() const override { return data_.size(); }
  const std::string& path() const override { return path_; }
  mutable int reads = 0;

 private:
  std::string data_;
  const std::string path_ = "shard";
};

TEST(VirtualFileWoven, RowsFromTwoRunsReadAsTheRuns) {
  constexpr uint64_t kRow = 256, kHalf = 32;
  std::string data((2 * kHalf + 3) * kRow, '\0');  // the halves 3 rows apart
  std::mt19937 rng(5);
  for (char& c : data) c = static_cast<char>(rng());
  CountingFile file(data);
  ptc::ShardRecord shard;
  std::string want;
  std::vector<Extent> rows, pairs;
  for (uint64_t i = 0; i < 2 * kHalf; ++i) {  // row 2k: row k of the first half; 2k + 1: of the second
    const uint64_t src = (i % 2 == 0 ? i / 2 : kHalf + 3 + i / 2) * kRow;
    want += data.substr(src, kRow);
    rows.push_back(Extent{i * kRow, kRow, Extent::kShard, 0, &file, src, &shard});
    if (i % 2 == 0)
      pairs.push_back(Extent{i * kRow, kRow, Extent::kShard, 0, &file, src, &shard, 2, (kHalf + 3) * kRow});
  }
  auto ok = [](const ptc::ShardRecord&, uint64_t, uint64_t) { return ptc::Status::OK(); };
  for (std::vector<Extent>* extents : {&rows, &pairs}) {
    VirtualFile woven("", *extents, want.size());
    std::string got(want.size(), '\0');
    file.reads = 0;
    auto n = woven.Read(0, got.size(), got.data(), ok);
    ASSERT_TRUE(n.ok() && *n == got.size());
    EXPECT_TRUE(got == want);
    EXPECT_EQ(file.reads, 2);  // the two halves, each once
    for (uint64_t offset : {uint64_t{1}, kRow - 3, 5 * kRow + 17}) {
      for (size_t len : {size_t{3}, size_t{kRow}, size_t{3 * kRow + 5}, size_t{40 * kRow}}) {
        std::string part(len, '\0');
        auto m = woven.Read(offset, len, part.data(), ok);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        EXPECT_EQ(part.substr(0, *m), want.substr(offset, *m)) << offset << "+" << len;
      }
    }
  }
}

}  // namespace
}  // namespace ptcfs
