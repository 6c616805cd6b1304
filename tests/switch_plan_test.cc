// Switch plans (transform/device/switch_plan.h): the bytes that must move and
// no more, the memory budget, message symmetry, determinism and the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "switch_util.h"
#include "test_util.h"
#include "transform/device/switch_plan.h"

namespace ptc::transform::device {
namespace {

using namespace ::ptc::testing;

// Bytes rank `r` must receive in B that it holds nowhere in A: the volume of
// each B segment minus every A segment of the same global tensor on r
// (segments of one rank are disjoint per tensor only within a buffer, so the
// subtraction goes box by box).
uint64_t MustMove(const std::vector<LocalTensor>& from, const std::vector<LocalTensor>& to) {
  uint64_t total = 0;
  for (const LocalTensor& t : to) {
    for (const Segment& s : t.segments) {
      std::vector<Box> rest = {s.box};
      for (const LocalTensor& f : from) {
        for (const Segment& held : f.segments) {
          if (held.tensor != s.tensor) continue;
          std::vector<Box> next;
          for (const Box& b : rest) {
            for (Box& part : Subtract(b, held.box)) next.push_back(std::move(part));
          }
          rest = std::move(next);
        }
      }
      for (const Box& b : rest) total += b.volume() * DTypeSize(t.dtype);
    }
  }
  return total;
}

TEST(SwitchPlan, MovesExactlyWhatNoRankHoldsLocally) {
  for (const SwitchCase& c : SwitchCases()) {
    for (uint64_t budget : {uint64_t{256}, uint64_t{1} << 20}) {
      SCOPED_TRACE(c.schema + " " + c.from + " -> " + c.to + " budget " + std::to_string(budget));
      auto plan = MakeSwitchPlan(MakeRequest(c, DType::kBF16, budget));
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      uint64_t must = 0, received = 0, sent = 0, payload = 0;
      for (int r = 0; r < plan->world; ++r) {
        const RankSchedule& rs = plan->ranks[r];
        must += MustMove(rs.from, rs.to);
        received += rs.bytes_received;
        sent += rs.bytes_sent;
        EXPECT_LE(rs.staging_bytes, budget) << "rank " << r;
        EXPECT_EQ(rs.buckets.size(), plan->num_buckets);
      }
      for (const auto& [link, bytes] : plan->messages) payload += bytes;
      EXPECT_EQ(plan->bytes_moved, must);  // local pieces first: nothing held locally is sent
      EXPECT_EQ(payload, must);
      EXPECT_EQ(plan->bytes_local + plan->bytes_moved, plan->bytes_total);
      EXPECT_EQ(sent, received);
      EXPECT_GE(sent, payload);                                // alignment padding only
      EXPECT_LE(sent, payload + 16 * (payload / 2 + 1));       // at most 16 bytes a piece of >= 2 bytes
    }
  }
}

TEST(SwitchPlan, MessagesMatchBetweenSenderAndReceiver) {
  for (const SwitchCase& c : SwitchCases()) {
    SCOPED_TRACE(c.from + " -> " + c.to);
    auto plan = MakeSwitchPlan(MakeRequest(c, DType::kF32, 4096));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (size_t b = 0; b < plan->num_buckets; ++b) {
      std::map<std::pair<int, int>, uint64_t> sends, recvs;
      for (int r = 0; r < plan->world; ++r) {
        const SwitchBucket& bucket = plan->ranks[r].buckets[b];
        uint64_t end = 0;
        for (const PeerSpan& s : bucket.sends) sends[{r, s.peer}] = s.bytes, end = std::max(end, s.offset + s.bytes);
        for (const PeerSpan& s : bucket.recvs) recvs[{s.peer, r}] = s.bytes, end = std::max(end, s.offset + s.bytes);
        EXPECT_EQ(end, bucket.staging_bytes);
        for (const StridedCopy& copy : bucket.pack) EXPECT_EQ(copy.dst, kStagingBuffer);
        for (const StridedCopy& copy : bucket.unpack) EXPECT_EQ(copy.src, kStagingBuffer);
      }
      EXPECT_EQ(sends, recvs) << "bucket " << b;
    }
  }
}

TEST(SwitchPlan, SameLayoutMovesNothing) {
  SwitchCase c = SwitchCases()[0];
  c.to = c.from;
  auto plan = MakeSwitchPlan(MakeRequest(c, DType::kBF16, 1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->bytes_moved, 0u);
  EXPECT_EQ(plan->num_buckets, 0u);
  EXPECT_EQ(plan->bytes_local, plan->bytes_total);
  for (const RankSchedule& rs : plan->ranks) {
    // Every buffer in one dense copy: the dimensions collapse.
    for (const StridedCopy& copy : rs.local) EXPECT_LE(copy.ndim, 1u);
  }
}

TEST(SwitchPlan, SendersBalancedAcrossReplicas) {
  // tp=2,dp=2 -> tp=1,pp=4: every stage needs the tp half it lacks, held by two
  // replicas (dp 0 and dp 1); the least-loaded rule spreads the sends.
  SwitchCase c{"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=2,dp=2", "tp=1,pp=4"};
  auto plan = MakeSwitchPlan(MakeRequest(c, DType::kBF16, 1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<uint64_t> sent(plan->world, 0);
  for (const auto& [link, bytes] : plan->messages) sent[link.first] += bytes;
  const uint64_t total = std::accumulate(sent.begin(), sent.end(), uint64_t{0});
  ASSERT_GT(total, 0u);
  for (int r = 0; r < plan->world; ++r) EXPECT_LE(sent[r], total * 35 / 100) << "rank " << r << " sends too much";
}

TEST(SwitchPlan, ZeroBudgetBucketsAndGradsDtype) {
  SwitchCase c = SwitchCases()[5];  // tp=2,pp=2 -> dp=8: every rank gathers the whole model
  SwitchRequest req = MakeRequest(c, DType::kBF16, 64);
  req.contents.grad_dtype = DType::kF32;
  auto plan = MakeSwitchPlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_GT(plan->num_buckets, 10u);
  for (const RankSchedule& rs : plan->ranks) EXPECT_LE(rs.staging_bytes, 64u);
  // Gradients move with the parameters, in their own dtype: 2 + 4 bytes an element.
  uint64_t grads = 0, params = 0;
  for (const RankSchedule& rs : plan->ranks) {
    for (const LocalTensor& t : rs.to) (t.dtype == DType::kF32 ? grads : params) += BufferBytes(t);
  }
  EXPECT_EQ(grads, 2 * params);

  req.budget_bytes = 63;
  EXPECT_FALSE(MakeSwitchPlan(req).ok());
}

TEST(SwitchPlan, ErrorsNameTheLayout) {
  SwitchCase c = SwitchCases()[0];
  c.to = "tp=3";
  auto plan = MakeSwitchPlan(MakeRequest(c, DType::kBF16, 1 << 20));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("layout B"), std::string::npos) << plan.status().ToString();
  EXPECT_NE(plan.status().message().find("tp=3"), std::string::npos) << plan.status().ToString();
}

TEST(SwitchPlan, DeterministicAndCached) {
  SwitchCase c = SwitchCases()[4];
  auto a = MakeSwitchPlan(MakeRequest(c, DType::kF8E4M3, 512));
  auto b = MakeSwitchPlan(MakeRequest(c, DType::kF8E4M3, 512));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->messages, b->messages);
  for (int r = 0; r < a->world; ++r) {
    ASSERT_EQ(a->ranks[r].buckets.size(), b->ranks[r].buckets.size());
    for (size_t k = 0; k < a->ranks[r].buckets.size(); ++k) {
      ASSERT_EQ(a->ranks[r].buckets[k].pack.size(), b->ranks[r].buckets[k].pack.size());
      for (size_t i = 0; i < a->ranks[r].buckets[k].pack.size(); ++i) {
        EXPECT_EQ(std::memcmp(&a->ranks[r].buckets[k].pack[i], &b->ranks[r].buckets[k].pack[i], sizeof(StridedCopy)),
                  0);
      }
    }
  }
  SwitchPlanCache cache;
  auto p1 = cache.Get(MakeRequest(c, DType::kF8E4M3, 512));
  auto p2 = cache.Get(MakeRequest(c, DType::kF8E4M3, 512));
  SwitchCase back = c;
  std::swap(back.from, back.to);
  auto p3 = cache.Get(MakeRequest(back, DType::kF8E4M3, 512));
  ASSERT_TRUE(p1.ok() && p2.ok() && p3.ok());
  EXPECT_EQ(p1->get(), p2->get());
  EXPECT_NE(p1->get(), p3->get());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.hits(), 1u);
}

// A schema's buffer (llama-eb's router bias, "buffer": true) moves with the
// parameters and has no gradient; the plan moves exactly what no rank holds.
TEST(SwitchPlan, ABufferMovesWithTheParametersAndHasNoGradient) {
  SwitchRequest request;
  request.spec = Spec("llama", "layers=2,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=4,moe_ffn=8");
  TensorRule bias;
  bias.name = "decoder.layers.{i}.mlp.router.expert_bias";
  bias.shape = {"experts"};
  bias.layers = LayerKind::kMoe;
  bias.buffer = true;
  std::vector<TensorRule>& rules = request.spec.schema.rules;
  rules.insert(std::find_if(rules.begin(), rules.end(),
                            [](const TensorRule& r) { return r.name == "decoder.layers.{i}.mlp.router.weight"; }) + 1,
               bias);
  request.from = *ParseConfig("tp=1,dp=2,ep=2");
  request.to = *ParseConfig("tp=2,dp=2,ep=4,etp=1");
  auto plan = MakeSwitchPlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  int biases = 0, bias_grads = 0, router_grads = 0;
  uint64_t must = 0;
  for (const RankSchedule& r : plan->ranks) {
    for (const auto* side : {&r.from, &r.to}) {
      for (const LocalTensor& t : *side) {
        biases += t.name.ends_with(".router.expert_bias") ? 1 : 0;
        bias_grads += t.name.ends_with(".router.expert_bias.grad") ? 1 : 0;
        router_grads += t.name.ends_with(".router.weight.grad") ? 1 : 0;
      }
    }
    must += MustMove(r.from, r.to);
  }
  EXPECT_EQ(plan->bytes_moved, must);
  EXPECT_EQ(plan->bytes_local + plan->bytes_moved, plan->bytes_total);
  EXPECT_EQ(biases, (2 + 4) * 2);  // every rank of both layouts holds both layers' bias
  EXPECT_EQ(bias_grads, 0);
  EXPECT_EQ(router_grads, (2 + 4) * 2);
}

TEST(SwitchPlan, MakeCopyCollapsesContiguousDimensions) {
  StridedCopy c;
  // A [4, 8] box inside a [4, 16] row-major tensor into dense staging: rows stay apart.
  ASSERT_TRUE(MakeCopy(0, 8, {16, 1}, kStagingBuffer, 0, {8, 1}, {4, 8}, 2, &c));
  EXPECT_EQ(c.ndim, 2u);
  EXPECT_EQ(c.bytes(), 64u);
  // Whole rows: one run.
  ASSERT_TRUE(MakeCopy(0, 0, {16, 1}, kStagingBuffer, 0, {16, 1}, {4, 16}, 2, &c));
  EXPECT_EQ(c.ndim, 1u);
  EXPECT_EQ(c.extent[0], 64);
  EXPECT_FALSE(MakeCopy(0, 0, {1000, 100, 10, 3, 1}, 0, 0, {1, 2, 4, 8, 16}, {2, 2, 2, 2, 2}, 1, &c));
}

}  // namespace
}  // namespace ptc::transform::device
