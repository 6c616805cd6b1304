// What a job that lost workers moves to (cluster/recovery.h): pure functions.
#include "cluster/recovery.h"

#include <gtest/gtest.h>

#include <tuple>

#include "test_util.h"

namespace ptc::cluster {
namespace {

using testing::Spec;

// 12 layers: pipelines of 1, 2, 3, 4, 6 and 12 stages split evenly.
constexpr const char* kDims = "layers=12,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96";

ParallelConfig Config(const char* text) {
  auto c = ParseConfig(text);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(Recovery, LostWorkersAreTheConfigsWorkersNotLive) {
  const ParallelConfig c = Config("tp=2,pp=4,dp=1,per_worker=2,workers=0+2+3+5,replicas=2");
  EXPECT_EQ(LostWorkers(c, {0, 2, 3, 5, 9}), std::vector<int>{});
  EXPECT_EQ(LostWorkers(c, {0, 3, 9}), (std::vector<int>{2, 5}));
  EXPECT_EQ(LostWorkers(c, {}), (std::vector<int>{0, 2, 3, 5}));
}

TEST(Recovery, SurvivorConfigKeepsTpAndFitsTheMostRanks) {
  const ModelSpec spec = Spec("llama", kDims);
  // 4 stages on 4 workers; worker 1 lost: 3 workers hold 6 ranks, tp=2 -> pp=3.
  auto c = SurvivorConfig(spec, Config("tp=2,pp=4,dp=1,per_worker=2,replicas=2"), {0, 2, 3});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ToString(), "tp=2,pp=3,dp=1,per_worker=2,workers=0+2+3,replicas=2");
  // dp shrinks first when the pipeline still fits: pp kept, dp 4 -> 2.
  c = SurvivorConfig(spec, Config("tp=2,pp=2,dp=4,per_worker=4"), {1, 3, 4});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->world_size(), 12);
  EXPECT_EQ(c->ToString(), "tp=2,pp=2,dp=3,per_worker=4,workers=1+3+4");
  // pp_layers stay when pp does; replicas never exceed the workers holding ranks.
  c = SurvivorConfig(spec, Config("tp=2,pp=2,dp=2,pp_layers=5+7,per_worker=2,replicas=2"), {3});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ToString(), "tp=2,pp=1,dp=1,per_worker=2,workers=3");
  c = SurvivorConfig(spec, Config("tp=2,pp=2,dp=2,pp_layers=5+7,per_worker=4,replicas=2"), {0});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ToString(), "tp=2,pp=2,dp=1,pp_layers=5+7,per_worker=4");
  // Survivors first in the placement, in worker order.
  c = SurvivorConfig(spec, Config("tp=1,pp=1,dp=4,per_worker=1"), {0, 1, 2});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ToString(), "tp=1,pp=1,dp=3,per_worker=1");
}

// A mixture-of-experts job keeps tp, cp and etp, and refits ep to the
// expert grid the survivors allow, the nearest to its own.
TEST(Recovery, SurvivorConfigOfAnMoeJobKeepsCpEtpAndRefitsEp) {
  const ModelSpec spec = Spec("llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96,experts=8,moe_ffn=32");
  // 16 ranks (tp=2, cp=2, pp=2, dp=2; experts over ep=4, edp=1) on 4 workers; worker 3 lost: 12 ranks fit
  // with pp=1, dp=3, where tp*cp*dp=12 takes etp*ep = 2*2 (ep=4 would need 16 | 12) - not pp=2, dp=1 (8).
  auto c = SurvivorConfig(spec, Config("tp=2,cp=2,pp=2,dp=2,ep=4,per_worker=4"), {0, 1, 2});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->world_size(), 12);
  EXPECT_EQ(std::make_tuple(c->tp, c->cp, c->pp, c->dp, c->ep, c->expert_tp()), std::make_tuple(2, 2, 1, 3, 2, 2));
  // etp=1 stays; ep=8 -> 4 on half the ranks (edp stays 1).
  c = SurvivorConfig(spec, Config("tp=2,etp=1,pp=1,dp=4,ep=8,per_worker=4"), {1});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(std::make_tuple(c->tp, c->etp, c->dp, c->ep, c->expert_dp()), std::make_tuple(2, 1, 2, 4, 1));
  EXPECT_EQ(c->workers, std::vector<int>{1});
  // Fewer GPUs than one tp*cp group: named.
  c = SurvivorConfig(spec, Config("tp=4,cp=2,pp=1,dp=1,ep=2,per_worker=4"), {0});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no config with tp=4,cp=2 fits the 1 live workers (0; per_worker=4)"),
            std::string::npos)
      << c.status().message();
}

TEST(Recovery, NoConfigFitsIsAClearError) {
  const ModelSpec spec = Spec("llama", kDims);
  auto c = SurvivorConfig(spec, Config("tp=4,pp=1,dp=2,per_worker=2"), {5});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("no config with tp=4 fits the 1 live workers (5; per_worker=2)"),
            std::string::npos)
      << c.status().message();
  EXPECT_FALSE(SurvivorConfig(spec, Config("tp=2,per_worker=2"), {}).ok());
}

}  // namespace
}  // namespace ptc::cluster
