// The cost model of per-length-group strategies (transform/device/cost_model.h)
// and the `ptcfs strategies` command: memory grows with tokens per sequence,
// attention time with its square; long groups get more tp/pp and short ones
// more dp; the fixed strategy holds every group; the switching order starts
// and ends at the base layout.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "transform/device/cost_model.h"

namespace ptc::transform::device {
namespace {

using namespace ::ptc::testing;

const char* kLlama7B = "layers=32,hidden=4096,heads=32,vocab=32000,seq=32768,ffn=11008";

LengthBucket Bucket(uint64_t len, double seqs) { return UniformBuckets({len}, {1.0}, seqs)[0]; }

TEST(SwitchCost, MemoryLinearAndTimeSuperlinearInLength) {
  ModelSpec spec = Spec("llama", kLlama7B);
  auto m = StatsOf(spec);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->params / 1e9, 6.74, 0.05);  // Llama-2 7B
  Hardware hw;
  ParallelConfig c = *ParseConfig("tp=2,pp=2,dp=2");
  LengthBucket a{4096, 16, 4096, 4096.0 * 4096}, b{8192, 16, 8192, 8192.0 * 8192}, d{16384, 16, 16384, 16384.0 * 16384};
  Estimate ea = EstimateBucket(*m, hw, c, a), eb = EstimateBucket(*m, hw, c, b), ed = EstimateBucket(*m, hw, c, d);
  // Activation memory is linear in s: equal steps for each doubling's 4096 and 8192 extra tokens.
  EXPECT_NEAR((ed.memory_bytes - eb.memory_bytes) / (eb.memory_bytes - ea.memory_bytes), 2.0, 1e-9);
  // Time: more than linear (the s^2 attention term), less than quadratic (the 6 P s term dominates at 4K).
  EXPECT_GT(eb.seconds / ea.seconds, 2.0);
  EXPECT_LT(eb.seconds / ea.seconds, 4.0);
  EXPECT_GT(ed.seconds / eb.seconds, eb.seconds / ea.seconds);
}

TEST(SwitchCost, LongGroupsGetModelParallelShortOnesDataParallel) {
  ModelSpec spec = Spec("llama", kLlama7B);
  Hardware hw;
  hw.memory_bytes = 80e9;  // A100/A800 80GB, HotSPa's setup
  auto buckets = UniformBuckets({2048, 8192, 32768}, {0.7, 0.2, 0.1}, 256);
  auto r = PlanStrategies(spec, hw, buckets);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ParallelConfig& short_c = r->chosen[0];
  const ParallelConfig& long_c = r->chosen[2];
  EXPECT_EQ(short_c.dp, 8) << short_c.ToString();
  EXPECT_GT(long_c.tp * long_c.pp, short_c.tp * short_c.pp) << long_c.ToString();
  for (size_t i = 0; i < buckets.size(); ++i) {
    EXPECT_TRUE(r->chosen_estimate[i].fits);
    EXPECT_TRUE(r->fixed_estimate[i].fits) << "the fixed strategy must hold every group";
    EXPECT_LE(r->chosen_estimate[i].seconds, r->fixed_estimate[i].seconds + 1e-12);
  }
  // dp=8 cannot hold a 32K sequence of a 7B model in 80 GB: the fixed one is model parallel.
  EXPECT_FALSE(EstimateBucket(*StatsOf(spec), hw, *ParseConfig("dp=8"), buckets[2]).fits);
  EXPECT_GT(r->speedup(), 1.0);
  // The cycle starts and ends at the base layout and visits each group once.
  ASSERT_EQ(r->order.size(), buckets.size());
  ASSERT_FALSE(r->switches.empty());
  EXPECT_EQ(r->switches.front().from, r->base);
  EXPECT_EQ(r->switches.back().to, r->base);
  for (const SwitchStep& s : r->switches) {
    EXPECT_NE(s.from, s.to);
    // Leaving pure dp moves nothing (every rank holds the whole model); other switches move bytes.
    if (s.from.dp != 8) {
      EXPECT_GT(s.bytes, 0u) << s.from.ToString() << " -> " << s.to.ToString();
    }
  }
}

TEST(SwitchCost, FixedStrategyAsGiven) {
  ModelSpec spec = Spec("llama", kLlama7B);
  Hardware hw;
  hw.memory_bytes = 80e9;
  auto buckets = UniformBuckets({2048, 32768}, {0.9, 0.1}, 128);
  ParallelConfig hotspa = *ParseConfig("tp=4,pp=2");
  auto r = PlanStrategies(spec, hw, buckets, &hotspa);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->fixed.tp, 4);
  EXPECT_EQ(r->fixed.pp, 2);
  auto best = PlanStrategies(spec, hw, buckets);
  ASSERT_TRUE(best.ok());
  EXPECT_GE(r->fixed_seconds, best->fixed_seconds);
  ParallelConfig dp8 = *ParseConfig("dp=8");
  auto bad = PlanStrategies(spec, hw, buckets, &dp8);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not hold"), std::string::npos) << bad.status().ToString();
}

TEST(SwitchCost, OneGroupNeedsNoSwitch) {
  ModelSpec spec = Spec("llama", kLlama7B);
  auto r = PlanStrategies(spec, Hardware{}, {Bucket(4096, 64)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->switches.empty());
  EXPECT_NEAR(r->speedup(), 1.0, 1e-9);
}

TEST(SwitchCost, NothingFitsIsAnError) {
  ModelSpec spec = Spec("llama", kLlama7B);
  Hardware hw;
  hw.memory_bytes = 16e9;
  auto r = PlanStrategies(spec, hw, {Bucket(32768, 8)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("32768-token"), std::string::npos) << r.status().ToString();
}

TEST(SwitchCost, CommandPrintsStrategies) {
  auto [rc, out] = Ptcfs(std::string("strategies --dims ") + kLlama7B +
                         " --buckets 2048,4096,8192,16384,32768 --shares 50,25,13,8,4 --memory-gb 80 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("predicted speedup"), std::string::npos) << out;
  EXPECT_NE(out.find("(8,1,1)"), std::string::npos) << out;
  // Shares from a dataset's real lengths: 1000 sequences of 100..32768 tokens, a third or so per bucket.
  TempDir tmp;
  ASSERT_EQ(Ptcfs("data synth --samples 1000 --min-len 100 --max-len 32768 --vocab 32000 " + tmp / "d").first, 0);
  auto [rc3, out3] = Ptcfs(std::string("strategies --dims ") + kLlama7B + " --buckets 8192,16384,32768 --source " +
                           tmp / "d" + " --global-batch 300 --json 2>&1");
  ASSERT_EQ(rc3, 0) << out3;
  auto j = nlohmann::json::parse(out3);
  double seqs = 0;
  for (const auto& b : j["buckets"]) seqs += b["sequences"].get<double>();
  EXPECT_NEAR(seqs, 300, 1e-6);
  EXPECT_NEAR(j["buckets"][2]["sequences"].get<double>(), 300 * 0.5, 30) << out3;  // (16384, 32768]: about half
  auto [rc2, out2] = Ptcfs("strategies --dims " + std::string(kLlama7B) + " --buckets 2048,4096 --shares 1 2>&1");
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("--shares: 1 shares for 2 buckets"), std::string::npos) << out2;
}

}  // namespace
}  // namespace ptc::transform::device
