#include "ptc/model/box.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>

namespace ptc {
namespace {

uint64_t Seed() {
  const char* env = std::getenv("PTCFS_TEST_SEED");
  uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("PTCFS_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

Box RandomBoxIn(std::mt19937_64& rng, const Box& outer) {
  Box b = outer;
  for (size_t d = 0; d < outer.rank(); ++d) {
    std::uniform_int_distribution<Index> pick(outer.begin[d], outer.end[d]);
    Index x = pick(rng), y = pick(rng);
    b.begin[d] = std::min(x, y);
    b.end[d] = std::max(x, y);
  }
  return b;
}

TEST(Box, VolumeShapeAndString) {
  Box b{{1, 2}, {4, 6}};
  EXPECT_EQ(b.volume(), 12);
  EXPECT_EQ(b.shape(), (Shape{3, 4}));
  EXPECT_EQ(b.ToString(), "[1:4, 2:6]");
  EXPECT_TRUE((Box{{1}, {1}}).empty());
}

TEST(Box, IntersectAndContain) {
  Box a{{0, 0}, {4, 4}}, b{{2, 3}, {6, 8}};
  auto i = Intersect(a, b);
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, (Box{{2, 3}, {4, 4}}));
  EXPECT_TRUE(Contains(a, *i));
  EXPECT_TRUE(Contains(b, *i));
  EXPECT_FALSE(Contains(a, b));
  EXPECT_FALSE(Intersect(a, Box{{4, 0}, {5, 4}}).has_value());
}

TEST(Box, ByteRangesMergeFullRows) {
  Box shard{{0, 0}, {4, 8}};
  auto r = ByteRanges(shard, Box{{1, 0}, {3, 8}}, 2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0], (std::pair<uint64_t, uint64_t>{16, 32}));
  r = ByteRanges(shard, Box{{1, 2}, {3, 4}}, 4);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (std::pair<uint64_t, uint64_t>{(8 + 2) * 4, 8}));
  EXPECT_EQ(r[1], (std::pair<uint64_t, uint64_t>{(16 + 2) * 4, 8}));
}

// CopyRegion against an element-by-element reference, random boxes, ranks 0-4.
TEST(Box, CopyRegionMatchesElementwiseReference) {
  std::mt19937_64 rng(Seed());
  for (int iter = 0; iter < 300; ++iter) {
    size_t rank = rng() % 5;
    Shape shape(rank);
    for (auto& s : shape) s = 1 + rng() % 6;
    Box full = Box::Full(shape);
    Box src_box = RandomBoxIn(rng, full), dst_box = RandomBoxIn(rng, full);
    auto region = Intersect(src_box, dst_box);
    if (rank == 0) region = Box{};
    if (!region) continue;
    std::vector<int32_t> src(src_box.volume()), dst(dst_box.volume(), -1);
    std::iota(src.begin(), src.end(), 0);
    CopyRegion(*region, src.data(), src_box, DenseLayout(src_box), dst.data(), dst_box, DenseLayout(dst_box),
               sizeof(int32_t));
    // Reference: walk every element of dst_box.
    const auto ss = RowMajorStrides(src_box.shape()), ds = RowMajorStrides(dst_box.shape());
    std::vector<Index> x(rank);
    for (Index flat = 0; flat < dst_box.volume(); ++flat) {
      Index rem = flat, s = 0, d = 0;
      bool inside = true;
      for (size_t k = 0; k < rank; ++k) {
        x[k] = dst_box.begin[k] + rem / ds[k];
        rem %= ds[k];
        inside &= x[k] >= region->begin[k] && x[k] < region->end[k];
        d += (x[k] - dst_box.begin[k]) * ds[k];
        s += (x[k] - src_box.begin[k]) * ss[k];
      }
      ASSERT_EQ(dst[d], inside ? src[s] : -1)
          << "iter " << iter << " src " << src_box.ToString() << " dst " << dst_box.ToString();
    }
  }
}

TEST(Box, FlatRangeToBoxesTilesTheRangeInOrder) {
  std::mt19937_64 rng(Seed());
  for (int iter = 0; iter < 500; ++iter) {
    size_t rank = 1 + rng() % 4;
    Shape shape(rank);
    for (auto& s : shape) s = 1 + rng() % 5;
    Index n = NumElements(shape);
    Index a = rng() % (n + 1), b = rng() % (n + 1);
    if (a > b) std::swap(a, b);
    auto boxes = FlatRangeToBoxes(shape, a, b);
    EXPECT_LE(boxes.size(), 2 * rank - 1 + 1);
    Index pos = a;
    for (const Box& box : boxes) {
      auto ranges = ByteRanges(Box::Full(shape), box, 1);
      ASSERT_EQ(ranges.size(), 1u) << box.ToString() << " not contiguous";
      ASSERT_EQ(static_cast<Index>(ranges[0].first), pos);
      pos += box.volume();
    }
    EXPECT_EQ(pos, b);
  }
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

TEST(Box, SubtractLeavesDisjointBoxesCoveringTheRest) {
  std::mt19937_64 rng(Seed());
  for (int iter = 0; iter < 300; ++iter) {
    size_t rank = 1 + rng() % 3;
    Shape shape(rank);
    for (auto& s : shape) s = 1 + rng() % 6;
    Box full = Box::Full(shape);
    Box a = RandomBoxIn(rng, full), b = RandomBoxIn(rng, full);
    std::vector<int> hits(full.volume(), 0);
    for (const Box& piece : Subtract(a, b)) {
      ASSERT_TRUE(Contains(a, piece));
      ASSERT_FALSE(Intersect(piece, b).has_value());
      for (auto [off, len] : ByteRanges(full, piece, 1)) {
        for (uint64_t i = off; i < off + len; ++i) hits[i]++;
      }
    }
    // Every element of a outside b is covered exactly once.
    for (Index flat = 0; flat < full.volume(); ++flat) {
      Box e;
      auto strides = RowMajorStrides(shape);
      Index rem = flat;
      for (size_t d = 0; d < rank; ++d) {
        e.begin.push_back(rem / strides[d]);
        e.end.push_back(rem / strides[d] + 1);
        rem %= strides[d];
      }
      bool in_a = Contains(a, e) && !a.empty(), in_b = Intersect(e, b).has_value();
      ASSERT_EQ(hits[flat], in_a && !in_b ? 1 : 0) << a.ToString() << " - " << b.ToString();
    }
  }
}

}  // namespace
}  // namespace ptc
