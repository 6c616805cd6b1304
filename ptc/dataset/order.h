// The global order of a dataset's samples in an epoch and how each global batch
// is cut among data-parallel ranks. Pure arithmetic: nothing here reads a file
// or holds an N-sized table. docs/dataset_format.md has the math in full.
//
//   position p in [0, N)  --Permutation(N, seed, epoch)-->  sample id
//   global batch k        = positions [k*B, min((k+1)*B, N))   (the last may be short)
//   rank r of D in batch k = the r-th of D contiguous near-equal parts of the batch;
//                            the first (len mod D) ranks get one sample more.
//
// State = (epoch, consumed samples), consumed = steps * B (or N at the epoch's end).
// Whatever D is at each step, the ranks' parts of batch k concatenated in rank
// order are exactly batch k: every sample once, in the unchanged run's order.
//
// Thread safety: Permutation, RankStream and the free functions are values and
// pure; GroupedRankStream is safe to call from several threads (it locks its cache).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ptc/base/mutex.h"
#include "ptc/base/status.h"

namespace ptc {

// A keyed pseudo-random bijection of [0, n): a 4-round Feistel network over the
// smallest power of four >= n (at least 4), cycle-walking until the result is
// below n (fewer than 4 steps on average). O(1) memory and time per index.
class Permutation {
 public:
  // REQUIRES: n >= 1.
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return n_; }
  // The sample at position i. REQUIRES: i < size().
  uint64_t operator()(uint64_t i) const;
  // The position of sample x: Inverse((*this)(i)) == i. REQUIRES: x < size().
  uint64_t Inverse(uint64_t x) const;

 private:
  static constexpr int kRounds = 4;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t x) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[kRounds];
};

// A contiguous run of positions in the epoch order.
struct PositionRange {
  uint64_t begin = 0;
  uint64_t count = 0;
  friend bool operator==(const PositionRange&, const PositionRange&) = default;
};

// The epoch's batches: n samples in global batches of b.
struct BatchGeometry {
  uint64_t n = 0;             // samples in the epoch
  uint64_t global_batch = 1;  // B >= 1

  // ceil(n / B): steps in one epoch.
  uint64_t num_batches() const { return n / global_batch + (n % global_batch != 0); }
  // Positions of batch k. REQUIRES: k < num_batches().
  PositionRange Batch(uint64_t k) const;
};

// Part `rank` of `len` items cut into `dp` contiguous near-equal parts; the
// first (len mod dp) parts have one more. Offsets relative to the start.
// REQUIRES: dp >= 1, 0 <= rank < dp.
PositionRange SplitEvenly(uint64_t len, int dp, int rank);

// Rank `rank` of `dp`'s share of batch k: SplitEvenly of the batch, shifted.
PositionRange RankPartOfBatch(const BatchGeometry& g, uint64_t k, int dp, int rank);

// Checks that the state can be cut: B >= 1, consumed <= n and at a batch
// boundary (a multiple of B, or n), dp >= 1, 0 <= rank < dp.
// \error InvalidArgument naming the value at fault.
Status CheckStreamArgs(const BatchGeometry& g, uint64_t consumed, int dp, int rank);

// The positions rank `rank` of `dp` consumes from `consumed` to the end of the
// epoch, in order: its part of each remaining batch. Random access in O(1).
class RankStream {
 public:
  // \error InvalidArgument as CheckStreamArgs.
  static Result<RankStream> Create(const BatchGeometry& g, uint64_t consumed, int dp, int rank);

  uint64_t size() const { return size_; }
  // The j-th position. REQUIRES: j < size().
  uint64_t Position(uint64_t j) const;
  // The first batch of the stream (consumed / B).
  uint64_t first_batch() const { return first_batch_; }

  // Forward iteration in O(1) per step, never materialising the stream.
  class Iterator {
   public:
    uint64_t operator*() const { return pos_; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return j_ == o.j_; }

   private:
    friend class RankStream;
    const RankStream* s_ = nullptr;
    uint64_t j_ = 0, k_ = 0, left_ = 0, pos_ = 0;  // index, batch, left in batch, position
    void Enter(uint64_t k);
  };
  Iterator begin() const;
  Iterator end() const;

 private:
  BatchGeometry g_;
  int dp_ = 1, rank_ = 0;
  uint64_t first_batch_ = 0;
  uint64_t full_batches_ = 0;  // remaining batches of exactly B samples
  uint64_t per_full_ = 0;      // this rank's count in a full batch
  uint64_t size_ = 0;
};

// A rank's samples in consumption order: what a view renders. Implementations
// must be safe to call from several threads.
class SampleSequence {
 public:
  virtual ~SampleSequence() = default;
  virtual uint64_t size() const = 0;
  // The sample id of the j-th item. REQUIRES: j < size().
  virtual uint64_t At(uint64_t j) const = 0;
};

// Permutation applied to a RankStream.
class RankSamples : public SampleSequence {
 public:
  RankSamples(Permutation perm, RankStream stream) : perm_(perm), stream_(stream) {}
  uint64_t size() const override { return stream_.size(); }
  uint64_t At(uint64_t j) const override { return perm_(stream_.Position(j)); }

 private:
  Permutation perm_;
  RankStream stream_;
};

// ---------------------------------------------------------------- length groups
//
// Optional sequence-length groups: bounds b_0 < b_1 < ... < b_{G-1} make G
// groups; a sample of length L is in the first group g with L <= b_g, and a
// sample longer than b_{G-1} is in the last group. Inside each global batch,
// group g's samples (in global order) are cut among group g's dp ranks with
// SplitEvenly; each group may have its own dp.

// \error InvalidArgument when bounds is empty, has more than 64 entries, or is
//        not strictly ascending and positive.
Status CheckLengthBounds(const std::vector<uint64_t>& bounds);
// REQUIRES: CheckLengthBounds(bounds).ok().
size_t GroupOf(const std::vector<uint64_t>& bounds, uint64_t length);

// Length of a sample id, e.g. its token count.
using LengthFn = std::function<uint64_t(uint64_t sample_id)>;

// The positions of batch k whose samples are in group `group`, in order.
std::vector<uint64_t> GroupMembers(const BatchGeometry& g, const Permutation& perm, const LengthFn& length,
                                   const std::vector<uint64_t>& bounds, uint64_t k, size_t group);

// Rank `rank` of `dp`'s samples of group `group`, batch by batch, from `consumed`
// to the end of the epoch. Create reads the length of every remaining sample
// once (O(N - consumed) time) and keeps one count per batch (O(N / B) memory);
// At is O(log batches) plus one pass over a batch's lengths when the batch is
// not the one last visited.
class GroupedRankStream : public SampleSequence {
 public:
  // \error InvalidArgument as CheckStreamArgs / CheckLengthBounds, or when
  //        group >= the number of groups.
  static Result<std::unique_ptr<GroupedRankStream>> Create(const BatchGeometry& g, Permutation perm, LengthFn length,
                                                           std::vector<uint64_t> bounds, uint64_t consumed,
                                                           size_t group, int dp, int rank);
  uint64_t size() const override { return cum_.back(); }
  uint64_t At(uint64_t j) const override;
  // The position (not the sample id) of the j-th item.
  uint64_t Position(uint64_t j) const;

 private:
  GroupedRankStream(const BatchGeometry& g, Permutation perm, LengthFn length, std::vector<uint64_t> bounds);
  BatchGeometry g_;
  Permutation perm_;
  LengthFn length_;
  std::vector<uint64_t> bounds_;
  size_t group_ = 0;
  int dp_ = 1, rank_ = 0;
  uint64_t first_batch_ = 0;
  std::vector<uint64_t> cum_;  // cum_[i]: items in batches first_batch_ .. first_batch_+i-1
  mutable Mutex mu_;
  mutable uint64_t cached_batch_ GUARDED_BY(mu_) = UINT64_MAX;
  mutable std::vector<uint64_t> cached_members_ GUARDED_BY(mu_);  // this rank's positions in it
};

}  // namespace ptc
