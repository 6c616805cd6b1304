// Megatron-Core's gradient buffer under the distributed optimizer
// (ptc/checkpoint/megatron/ddp_buffer.h): against the layouts megatron-core
// 0.16.1 itself makes (tests/data/ddp_buffer_golden.json, written by
// tests/ddp_buffer_golden.py: its param_index_map, buckets, and the
// ShardedTensors its dp_reshardable form writes per rank), and against a
// reference in this file that places the buffer element by element from the
// rules of docs/megatron_format.md, on random parameter lists (seed printed,
// PTCFS_SEED overrides).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/megatron/ddp_buffer.h"

namespace ptc::megatron {
namespace {

std::vector<DdpParam> Params(const std::vector<Index>& sizes, int shared) {
  std::vector<DdpParam> params;
  for (size_t i = 0; i < sizes.size(); ++i) params.push_back({sizes[i], static_cast<int>(i) == shared});
  return params;
}

TEST(DdpBuffer, MatchesMegatronCore) {
  std::ifstream in(std::string(PTCFS_SOURCE_DIR) + "/tests/data/ddp_buffer_golden.json");
  ASSERT_TRUE(in) << "tests/data/ddp_buffer_golden.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_EQ(golden["megatron_core"], "0.16.1");
  ASSERT_GE(golden["cases"].size(), 9u);
  for (const nlohmann::json& c : golden["cases"]) {
    const DdpOptions options{c["dp"], c["bucket_size"], c["pad_for_high_nccl_busbw"]};
    SCOPED_TRACE("dp " + std::to_string(options.dp) + " bucket " + std::to_string(options.bucket_size) +
                 " shared " + c["shared"].dump());
    const std::vector<DdpParam> params = Params(c["sizes"].get<std::vector<Index>>(), c["shared"]);
    Result<DdpBuffer> buffer = LayOutDdpBuffer(params, options);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    std::vector<DdpSlot> slots;
    for (const nlohmann::json& p : c["params"]) slots.push_back({p[0], p[1], p[2], p[3]});
    EXPECT_EQ(buffer->slots, slots);
    std::vector<DdpBucket> buckets;
    for (const nlohmann::json& b : c["buckets"]) buckets.push_back({b[0], b[1], b[2]});
    EXPECT_EQ(buffer->buckets, buckets);
    for (int rank = 0; rank < options.dp; ++rank) {
      const nlohmann::json& want = c["ranks"][rank];
      std::vector<std::vector<Index>> got;  // [bucket, offset, size, padding], as the golden
      bool empty_bucket = false;
      for (size_t b = 0; b < buffer->buckets.size(); ++b) {
        const std::vector<DdpPiece> pieces = DdpRankPieces(*buffer, b, rank, options.dp);
        empty_bucket |= std::none_of(pieces.begin(), pieces.end(), [](const DdpPiece& p) { return p.param != kDdpPadding; });
        for (const DdpPiece& p : pieces) got.push_back({Index(b), p.at, p.end - p.begin, p.param == kDdpPadding});
      }
      if (want.is_string()) {  // megatron-core refuses a rank piece without a parameter ("empty bucket")
        EXPECT_TRUE(empty_bucket) << "rank " << rank << ": megatron-core says " << want;
        continue;
      }
      EXPECT_FALSE(empty_bucket) << "rank " << rank;
      std::vector<std::vector<Index>> wanted;
      for (const nlohmann::json& w : want) wanted.push_back({w[0], w[1], w[2], w[3].get<bool>()});
      EXPECT_EQ(got, wanted) << "rank " << rank;
    }
  }
}

// The rules of docs/megatron_format.md, element by element: `owner[i]` is the
// parameter at buffer element i (-1: padding), `bucket_of[i]` its bucket.
struct Reference {
  std::vector<int> owner, bucket_of;
  std::vector<Index> offset_in_param;
  std::vector<DdpBucket> buckets;
};

Reference Place(const std::vector<DdpParam>& params, const DdpOptions& o) {
  Reference r;
  const Index divisor = std::lcm(std::lcm(Index{o.dp}, Index{128}), o.pad_for_high_nccl_busbw ? 65536 : 1);
  Index bucket_start = 0, last_end = 0;
  int in_bucket = 0;
  auto pad_to = [&](Index n) {
    while (Index(r.owner.size()) < n) {
      r.owner.push_back(-1), r.bucket_of.push_back(int(r.buckets.size())), r.offset_in_param.push_back(0);
    }
  };
  auto close = [&](Index unpadded_end) {
    Index end = unpadded_end;
    while (end % divisor != 0) ++end;
    pad_to(end);
    r.buckets.push_back({bucket_start, end - bucket_start, unpadded_end - bucket_start});
    bucket_start = end, in_bucket = 0;
  };
  for (int i = int(params.size()) - 1; i >= 0; --i) {
    Index start = Index(r.owner.size());
    while (start % 64 != 0) ++start;
    if (params[i].shared_embedding && in_bucket > 0) {
      close(start);
      start = Index(r.owner.size());
    }
    pad_to(start);
    for (Index k = 0; k < params[i].numel; ++k) {
      r.owner.push_back(i), r.bucket_of.push_back(int(r.buckets.size())), r.offset_in_param.push_back(k);
    }
    last_end = Index(r.owner.size());
    ++in_bucket;
    if ((o.bucket_size > 0 && last_end - bucket_start >= o.bucket_size) || params[i].shared_embedding) close(last_end);
  }
  if (in_bucket > 0) close(last_end);
  return r;
}

// A rank's pieces of a bucket from the element map: maximal runs of one
// parameter's consecutive elements, and runs of padding that start before the
// unpadded end.
std::vector<DdpPiece> ReferencePieces(const Reference& r, size_t bucket, int rank, int dp) {
  const DdpBucket& b = r.buckets[bucket];
  const Index local = b.numel / dp;
  std::vector<DdpPiece> pieces;
  for (Index at = rank * local; at < (rank + 1) * local;) {
    const Index i = b.offset + at;
    Index end = at + 1;
    while (end < (rank + 1) * local && r.owner[b.offset + end] == r.owner[i]) ++end;
    if (r.owner[i] >= 0) {
      pieces.push_back({size_t(r.owner[i]), r.offset_in_param[i], r.offset_in_param[i] + (end - at), at});
    } else if (at < b.numel_unpadded) {
      pieces.push_back({kDdpPadding, at, end, at});
    }
    at = end;
  }
  return pieces;
}

TEST(DdpBuffer, MatchesElementwiseReferenceOnRandomParameters) {
  const char* env = std::getenv("PTCFS_SEED");
  const unsigned seed = env ? unsigned(std::strtoul(env, nullptr, 10)) : std::random_device{}();
  std::printf("seed %u (PTCFS_SEED overrides)\n", seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round));
    std::vector<DdpParam> params(1 + rng() % 12);
    for (DdpParam& p : params) p.numel = std::vector<Index>{1, 7, 63, 64, 65, 127, 300, 1000}[rng() % 8];
    if (rng() % 3 == 0) params[rng() % params.size()].shared_embedding = true;
    const DdpOptions o{int(1 + rng() % 5), std::vector<Index>{0, 100, 256, 700}[rng() % 4], rng() % 8 == 0};
    const Reference ref = Place(params, o);
    Result<DdpBuffer> buffer = LayOutDdpBuffer(params, o);
    ASSERT_TRUE(buffer.ok());
    ASSERT_EQ(buffer->buckets, ref.buckets);
    for (const DdpSlot& s : buffer->slots) {
      ASSERT_EQ(ref.owner[s.start], int(s.param));
      ASSERT_EQ(ref.offset_in_param[s.start], 0);
      ASSERT_EQ(ref.bucket_of[s.start], s.bucket);
      ASSERT_EQ(s.end - s.start, params[s.param].numel);
    }
    ASSERT_EQ(buffer->slots.size(), params.size());
    for (size_t b = 0; b < ref.buckets.size(); ++b) {
      // The pieces of every rank tile [0, numel_unpadded), but for a gap that
      // starts before its end and runs past it (a bucket a shared embedding
      // closed at its aligned start, after a parameter ending unaligned).
      Index covered = 0;
      for (int rank = 0; rank < o.dp; ++rank) {
        const std::vector<DdpPiece> pieces = DdpRankPieces(*buffer, b, rank, o.dp);
        ASSERT_EQ(pieces, ReferencePieces(ref, b, rank, o.dp)) << "bucket " << b << " rank " << rank;
        for (const DdpPiece& p : pieces) {
          if (p.at >= ref.buckets[b].numel_unpadded) continue;
          ASSERT_EQ(p.at, covered);
          covered = p.at + (p.end - p.begin);
        }
      }
      ASSERT_GE(covered, ref.buckets[b].numel_unpadded);
      for (Index i = ref.buckets[b].numel_unpadded; i < covered; ++i) ASSERT_EQ(ref.owner[ref.buckets[b].offset + i], -1);
    }
  }
}

TEST(DdpBuffer, RefusesBadOptionsNamingTheRule) {
  const std::vector<DdpParam> params = {{10}, {20}};
  EXPECT_EQ(LayOutDdpBuffer(params, {0}).status().message(), "DDP buffer: dp 0 < 1");
  EXPECT_EQ(LayOutDdpBuffer(params, {2, -1}).status().message(), "DDP buffer: bucket size -1 < 0");
  const std::vector<DdpParam> negative = {{10}, {-3}};
  EXPECT_EQ(LayOutDdpBuffer(negative, {2}).status().message(), "DDP buffer: parameter 1 has -3 elements");
  const std::vector<DdpParam> huge = {{Index{1} << 59}, {Index{1} << 59}, {Index{1} << 59}};
  EXPECT_EQ(LayOutDdpBuffer(huge, {2}).status().message(), "DDP buffer: more than 2^60 elements");
  Result<DdpBuffer> none = LayOutDdpBuffer({}, {4});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->slots.empty() && none->buckets.empty());
}

}  // namespace
}  // namespace ptc::megatron
