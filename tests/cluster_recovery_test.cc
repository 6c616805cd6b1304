// What a job that lost workers moves to (cluster/recovery.h): pure functions.
#include "cluster/recovery.h"

#include <gtest/gtest.h>

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
