// The global order and its partition among data-parallel ranks: the permutation
// is a bijection, and any sequence of dp changes consumes the unchanged run's
// order exactly once (the property of issue 5).
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "ptc/dataset/order.h"
#include "test_util.h"

namespace ptc {
namespace {

void ExpectBijection(uint64_t n, uint64_t seed, uint64_t epoch) {
  Permutation perm(n, seed, epoch);
  std::vector<bool> seen(n, false);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t x = perm(i);
    ASSERT_LT(x, n) << "n=" << n << " seed=" << seed;
    ASSERT_FALSE(seen[x]) << "n=" << n << " seed=" << seed << " sample " << x << " twice";
    seen[x] = true;
    ASSERT_EQ(perm.Inverse(x), i) << "n=" << n << " seed=" << seed;
  }
}

TEST(PermutationTest, BijectionForManySizesAndSeeds) {
  std::vector<uint64_t> sizes = {1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 97, 101, 127, 1009, 4093, 65521};
  for (int k = 1; k <= 17; ++k) {
    for (int d : {-1, 0, 1}) sizes.push_back((uint64_t{1} << k) + d);
  }
  for (uint64_t n : sizes) {
    for (uint64_t seed : {0ULL, 1ULL, 42ULL, 0xdeadbeefULL}) ExpectBijection(n, seed, seed % 3);
  }
}

TEST(PermutationTest, RandomSizesAreBijections) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int t = 0; t < 200; ++t) ExpectBijection(1 + rng() % 3000, rng(), rng() % 10);
}

TEST(PermutationTest, SeedAndEpochChangeTheOrder) {
  Permutation a(1000, 1, 0), b(1000, 2, 0), c(1000, 1, 1);
  int same_ab = 0, same_ac = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_ab += a(i) == b(i);
    same_ac += a(i) == c(i);
  }
  EXPECT_LT(same_ab, 20);
  EXPECT_LT(same_ac, 20);
}

TEST(PermutationTest, BillionSamplesNeedNoTable) {
  const uint64_t n = 1'000'000'000;
  auto start = std::chrono::steady_clock::now();
  Permutation perm(n, 7, 3);
  std::mt19937_64 rng(1);
  for (int t = 0; t < 100000; ++t) {
    const uint64_t i = rng() % n;
    const uint64_t x = perm(i);
    ASSERT_LT(x, n);
    ASSERT_EQ(perm.Inverse(x), i);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The largest domains work too.
  Permutation huge(UINT64_MAX, 1, 0);
  EXPECT_EQ(huge.Inverse(huge(12345)), 12345u);
}

TEST(SplitTest, NearEqualContiguousParts) {
  for (uint64_t len = 0; len < 40; ++len) {
    for (int dp = 1; dp < 12; ++dp) {
      uint64_t next = 0;
      for (int r = 0; r < dp; ++r) {
        PositionRange p = SplitEvenly(len, dp, r);
        EXPECT_EQ(p.begin, next);
        EXPECT_EQ(p.count, len / dp + (static_cast<uint64_t>(r) < len % dp));
        next += p.count;
      }
      EXPECT_EQ(next, len);
    }
  }
}

TEST(RankStreamTest, RejectsBadArguments) {
  BatchGeometry g{100, 8};
  EXPECT_NE(RankStream::Create(g, 101, 1, 0).status().message().find("exceed"), std::string::npos);
  EXPECT_NE(RankStream::Create(g, 12, 1, 0).status().message().find("batch boundary"), std::string::npos);
  EXPECT_NE(RankStream::Create(g, 8, 0, 0).status().message().find("dp must be"), std::string::npos);
  EXPECT_NE(RankStream::Create(g, 8, 4, 4).status().message().find("dp rank 4"), std::string::npos);
  EXPECT_TRUE(RankStream::Create(g, 100, 4, 3).ok());
  EXPECT_EQ(RankStream::Create(g, 100, 4, 3)->size(), 0u);
  EXPECT_FALSE(RankStream::Create(BatchGeometry{100, 0}, 0, 1, 0).ok());
}

// Iteration and random access agree, and the size is the sum of the parts.
TEST(RankStreamTest, IterationMatchesRandomAccess) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int t = 0; t < 300; ++t) {
    BatchGeometry g{1 + rng() % 500, 1 + rng() % 40};
    const int dp = 1 + static_cast<int>(rng() % 50);
    const int rank = static_cast<int>(rng() % dp);
    const uint64_t consumed = std::min(g.n, (rng() % (g.num_batches() + 1)) * g.global_batch);
    RankStream s = *RankStream::Create(g, consumed, dp, rank);
    uint64_t expected = 0;
    for (uint64_t k = s.first_batch(); k < g.num_batches(); ++k) {
      expected += RankPartOfBatch(g, k, dp, rank).count;
    }
    ASSERT_EQ(s.size(), expected);
    uint64_t j = 0;
    for (uint64_t pos : s) {
      ASSERT_LT(j, s.size());
      ASSERT_EQ(pos, s.Position(j)) << "j=" << j;
      ++j;
    }
    ASSERT_EQ(j, s.size());
  }
}

// Issue 5's property: a random sequence of (steps, dp) changes, including dp
// that does not divide B, dp larger than B and changes in the middle of the
// epoch. Each rank reads its stream from the current state; batch by batch, the
// ranks' items concatenated in rank order are the unchanged run's batch, and the
// whole epoch is every sample exactly once.
TEST(DataParallelChangeTest, EverySampleExactlyOnceInTheUnchangedOrder) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int run = 0; run < 400; ++run) {
    const uint64_t n = 1 + rng() % 2000;
    BatchGeometry g{n, 1 + rng() % 64};
    const uint64_t seed = rng(), epoch = rng() % 5;
    Permutation perm(n, seed, epoch);
    std::vector<uint64_t> consumed_ids;
    uint64_t step = 0;
    SCOPED_TRACE("run " + std::to_string(run) + " n=" + std::to_string(n) + " B=" + std::to_string(g.global_batch));
    while (step < g.num_batches()) {
      const int dp = 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? 2 * g.global_batch + 3 : 9));
      const uint64_t steps = 1 + rng() % (g.num_batches() - step);
      const uint64_t consumed = std::min(n, step * g.global_batch);
      std::vector<RankStream> streams;
      std::vector<RankStream::Iterator> its;
      for (int r = 0; r < dp; ++r) streams.push_back(*RankStream::Create(g, consumed, dp, r));
      for (int r = 0; r < dp; ++r) its.push_back(streams[r].begin());
      for (uint64_t k = step; k < step + steps; ++k) {
        // Each rank takes its count for this batch, as a trainer would.
        for (int r = 0; r < dp; ++r) {
          for (uint64_t c = RankPartOfBatch(g, k, dp, r).count; c > 0; --c) {
            ASSERT_FALSE(its[r] == streams[r].end());
            consumed_ids.push_back(perm(*its[r]));
            ++its[r];
          }
        }
        ASSERT_EQ(consumed_ids.size(), std::min(n, (k + 1) * g.global_batch));
      }
      step += steps;
    }
    ASSERT_EQ(consumed_ids.size(), n);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(consumed_ids[i], perm(i)) << "position " << i;
      ASSERT_FALSE(seen[consumed_ids[i]]);
      seen[consumed_ids[i]] = true;
    }
  }
}

// Length groups: in every batch the groups' rank parts partition the batch,
// and inside a group the global order is kept.
TEST(LengthGroupsTest, GroupsPartitionEveryBatch) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int run = 0; run < 150; ++run) {
    const uint64_t n = 1 + rng() % 600;
    BatchGeometry g{n, 1 + rng() % 40};
    Permutation perm(n, rng(), 0);
    std::vector<uint64_t> lengths(n);
    for (auto& l : lengths) l = 1 + rng() % 100;
    LengthFn length = [&lengths](uint64_t id) { return lengths[id]; };
    std::vector<uint64_t> bounds = {10 + rng() % 20, 50 + rng() % 20};
    if (rng() % 2) bounds.push_back(90);
    const uint64_t consumed = std::min(n, (rng() % (g.num_batches() + 1)) * g.global_batch);
    // Per group: dp, and each rank's stream.
    std::vector<uint64_t> got;
    std::vector<std::vector<std::unique_ptr<GroupedRankStream>>> streams(bounds.size());
    for (size_t grp = 0; grp < bounds.size(); ++grp) {
      const int dp = 1 + static_cast<int>(rng() % 7);
      for (int r = 0; r < dp; ++r) {
        auto s = GroupedRankStream::Create(g, perm, length, bounds, consumed, grp, dp, r);
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        for (uint64_t j = 0; j < (*s)->size(); ++j) {
          const uint64_t pos = (*s)->Position(j);
          ASSERT_EQ(GroupOf(bounds, lengths[perm(pos)]), grp);
          if (j > 0) {
            ASSERT_LT((*s)->Position(j - 1), pos) << "order inside a group";
          }
          got.push_back(pos);
        }
      }
    }
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got.size(), n - consumed);
    for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], consumed + i);
  }
}

TEST(LengthGroupsTest, BoundsAndGroupOf) {
  EXPECT_FALSE(CheckLengthBounds({}).ok());
  EXPECT_NE(CheckLengthBounds({4096, 4096}).message().find("strictly ascending"), std::string::npos);
  EXPECT_FALSE(CheckLengthBounds({0, 5}).ok());
  std::vector<uint64_t> b = {4096, 16384};
  EXPECT_TRUE(CheckLengthBounds(b).ok());
  EXPECT_EQ(GroupOf(b, 1), 0u);
  EXPECT_EQ(GroupOf(b, 4096), 0u);
  EXPECT_EQ(GroupOf(b, 4097), 1u);
  EXPECT_EQ(GroupOf(b, 16384), 1u);
  EXPECT_EQ(GroupOf(b, 100000), 1u);  // longer than the last bound: the last group
}

}  // namespace
}  // namespace ptc
