#include "ptc/dataset/order.h"

#include <algorithm>
#include <string>

namespace ptc {
namespace {

// splitmix64's output function: a fast bijective 64-bit mixer.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Bits needed for values below n, rounded up to an even count, at least 2.
int DomainBits(uint64_t n) {
  int bits = 0;
  while (bits < 64 && (n - 1) >> bits != 0) ++bits;
  bits += bits & 1;
  return std::max(bits, 2);
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  half_bits_ = DomainBits(n) / 2;
  half_mask_ = half_bits_ == 32 ? 0xffffffffULL : (uint64_t{1} << half_bits_) - 1;
  uint64_t state = Mix(seed ^ 0x70746366735f6461ULL) ^ Mix(epoch + 0x9e3779b97f4a7c15ULL);
  for (uint64_t& key : keys_) {
    state += 0x9e3779b97f4a7c15ULL;
    key = Mix(state);
  }
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (int i = 0; i < kRounds; ++i) {
    const uint64_t f = Mix(r ^ keys_[i]) & half_mask_;
    const uint64_t next = l ^ f;
    l = r;
    r = next;
  }
  return (l << half_bits_) | r;
}

uint64_t Permutation::Decrypt(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (int i = kRounds - 1; i >= 0; --i) {
    const uint64_t prev = r ^ (Mix(l ^ keys_[i]) & half_mask_);
    r = l;
    l = prev;
  }
  return (l << half_bits_) | r;
}

// Cycle-walking: the Feistel network permutes [0, 4^k); following its cycle
// from i until it comes back below n restricts it to a permutation of [0, n).
uint64_t Permutation::operator()(uint64_t i) const {
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

uint64_t Permutation::Inverse(uint64_t x) const {
  uint64_t i = Decrypt(x);
  while (i >= n_) i = Decrypt(i);
  return i;
}

PositionRange BatchGeometry::Batch(uint64_t k) const {
  const uint64_t begin = k * global_batch;
  return {begin, std::min(global_batch, n - begin)};
}

PositionRange SplitEvenly(uint64_t len, int dp, int rank) {
  const uint64_t d = static_cast<uint64_t>(dp), r = static_cast<uint64_t>(rank);
  const uint64_t q = len / d, rem = len % d;
  return {r * q + std::min(r, rem), q + (r < rem ? 1 : 0)};
}

PositionRange RankPartOfBatch(const BatchGeometry& g, uint64_t k, int dp, int rank) {
  const PositionRange batch = g.Batch(k);
  PositionRange part = SplitEvenly(batch.count, dp, rank);
  part.begin += batch.begin;
  return part;
}

Status CheckStreamArgs(const BatchGeometry& g, uint64_t consumed, int dp, int rank) {
  if (g.global_batch == 0) return InvalidArgumentError("global batch size must be at least 1");
  if (consumed > g.n) {
    return InvalidArgumentError("consumed samples " + std::to_string(consumed) + " exceed the epoch's " +
                                std::to_string(g.n) + " samples");
  }
  if (consumed % g.global_batch != 0 && consumed != g.n) {
    return InvalidArgumentError("consumed samples " + std::to_string(consumed) +
                                " is not at a batch boundary (global batch " + std::to_string(g.global_batch) + ")");
  }
  if (dp < 1) return InvalidArgumentError("dp must be at least 1, got " + std::to_string(dp));
  if (rank < 0 || rank >= dp) {
    return InvalidArgumentError("dp rank " + std::to_string(rank) + " is outside [0, " + std::to_string(dp) + ")");
  }
  return Status::OK();
}

// ---------------------------------------------------------------- RankStream

Result<RankStream> RankStream::Create(const BatchGeometry& g, uint64_t consumed, int dp, int rank) {
  PTC_RETURN_IF_ERROR(CheckStreamArgs(g, consumed, dp, rank));
  RankStream s;
  s.g_ = g;
  s.dp_ = dp;
  s.rank_ = rank;
  s.first_batch_ = consumed == g.n ? g.num_batches() : consumed / g.global_batch;
  s.full_batches_ = g.n / g.global_batch - std::min(g.n / g.global_batch, s.first_batch_);
  s.per_full_ = SplitEvenly(g.global_batch, dp, rank).count;
  s.size_ = s.full_batches_ * s.per_full_;
  const uint64_t last = g.num_batches();
  if (g.n % g.global_batch != 0 && s.first_batch_ < last) s.size_ += RankPartOfBatch(g, last - 1, dp, rank).count;
  return s;
}

uint64_t RankStream::Position(uint64_t j) const {
  if (per_full_ != 0 && j < full_batches_ * per_full_) {
    const uint64_t k = first_batch_ + j / per_full_;
    return RankPartOfBatch(g_, k, dp_, rank_).begin + j % per_full_;
  }
  // In the short last batch.
  const uint64_t k = g_.num_batches() - 1;
  return RankPartOfBatch(g_, k, dp_, rank_).begin + (j - full_batches_ * per_full_);
}

void RankStream::Iterator::Enter(uint64_t k) {
  // Skips batches where this rank has nothing (dp larger than the batch).
  while (j_ < s_->size_) {
    const PositionRange part = RankPartOfBatch(s_->g_, k, s_->dp_, s_->rank_);
    if (part.count != 0) {
      k_ = k;
      left_ = part.count;
      pos_ = part.begin;
      return;
    }
    ++k;
  }
}

RankStream::Iterator& RankStream::Iterator::operator++() {
  ++j_;
  if (--left_ != 0) {
    ++pos_;
  } else {
    Enter(k_ + 1);
  }
  return *this;
}

RankStream::Iterator RankStream::begin() const {
  Iterator it;
  it.s_ = this;
  it.Enter(first_batch_);
  return it;
}

RankStream::Iterator RankStream::end() const {
  Iterator it;
  it.s_ = this;
  it.j_ = size_;
  return it;
}

// ---------------------------------------------------------------- length groups

Status CheckLengthBounds(const std::vector<uint64_t>& bounds) {
  if (bounds.empty()) return InvalidArgumentError("length buckets: at least one bound is needed");
  if (bounds.size() > 64) return InvalidArgumentError("length buckets: at most 64 bounds");
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] == 0) return InvalidArgumentError("length buckets: bound " + std::to_string(i) + " is 0");
    if (i > 0 && bounds[i] <= bounds[i - 1]) {
      return InvalidArgumentError("length buckets: bounds must be strictly ascending (" +
                                  std::to_string(bounds[i - 1]) + " then " + std::to_string(bounds[i]) + ")");
    }
  }
  return Status::OK();
}

size_t GroupOf(const std::vector<uint64_t>& bounds, uint64_t length) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), length);
  return it == bounds.end() ? bounds.size() - 1 : static_cast<size_t>(it - bounds.begin());
}

std::vector<uint64_t> GroupMembers(const BatchGeometry& g, const Permutation& perm, const LengthFn& length,
                                   const std::vector<uint64_t>& bounds, uint64_t k, size_t group) {
  std::vector<uint64_t> out;
  const PositionRange batch = g.Batch(k);
  for (uint64_t p = batch.begin; p < batch.begin + batch.count; ++p) {
    if (GroupOf(bounds, length(perm(p))) == group) out.push_back(p);
  }
  return out;
}

GroupedRankStream::GroupedRankStream(const BatchGeometry& g, Permutation perm, LengthFn length,
                                     std::vector<uint64_t> bounds)
    : g_(g), perm_(perm), length_(std::move(length)), bounds_(std::move(bounds)) {}

Result<std::unique_ptr<GroupedRankStream>> GroupedRankStream::Create(const BatchGeometry& g, Permutation perm,
                                                                     LengthFn length, std::vector<uint64_t> bounds,
                                                                     uint64_t consumed, size_t group, int dp,
                                                                     int rank) {
  PTC_RETURN_IF_ERROR(CheckStreamArgs(g, consumed, dp, rank));
  PTC_RETURN_IF_ERROR(CheckLengthBounds(bounds));
  if (group >= bounds.size()) {
    return InvalidArgumentError("group " + std::to_string(group) + " is outside [0, " + std::to_string(bounds.size()) +
                                ")");
  }
  std::unique_ptr<GroupedRankStream> s(new GroupedRankStream(g, perm, std::move(length), std::move(bounds)));
  s->group_ = group;
  s->dp_ = dp;
  s->rank_ = rank;
  s->first_batch_ = consumed == g.n ? g.num_batches() : consumed / g.global_batch;
  s->cum_.reserve(g.num_batches() - s->first_batch_ + 1);
  s->cum_.push_back(0);
  for (uint64_t k = s->first_batch_; k < g.num_batches(); ++k) {
    const PositionRange batch = g.Batch(k);
    uint64_t in_group = 0;
    for (uint64_t p = batch.begin; p < batch.begin + batch.count; ++p) {
      in_group += GroupOf(s->bounds_, s->length_(s->perm_(p))) == group;
    }
    s->cum_.push_back(s->cum_.back() + SplitEvenly(in_group, dp, rank).count);
  }
  return s;
}

uint64_t GroupedRankStream::Position(uint64_t j) const {
  // The batch i (relative) with cum_[i] <= j < cum_[i+1].
  const size_t i = static_cast<size_t>(std::upper_bound(cum_.begin(), cum_.end(), j) - cum_.begin()) - 1;
  const uint64_t k = first_batch_ + i;
  MutexLock lock(&mu_);
  if (cached_batch_ != k) {
    std::vector<uint64_t> members = GroupMembers(g_, perm_, length_, bounds_, k, group_);
    const PositionRange part = SplitEvenly(members.size(), dp_, rank_);
    cached_members_.assign(members.begin() + part.begin, members.begin() + part.begin + part.count);
    cached_batch_ = k;
  }
  return cached_members_[j - cum_[i]];
}

uint64_t GroupedRankStream::At(uint64_t j) const { return perm_(Position(j)); }

}  // namespace ptc
