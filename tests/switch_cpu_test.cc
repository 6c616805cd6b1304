// The CPU executor (transform/device/cpu_executor.h): every rank's buffers
// after a switch equal, bit for bit, the independent reference of the target
// layout (switch_util.h), for tp/pp/dp/ZeRO changes and uneven pipelines, in
// 4-, 2- and 1-byte dtypes, under budgets that force many buckets; bytes on
// the wire are what the plan says and staging stays within the budget.
#include <gtest/gtest.h>

#include <random>

#include "switch_util.h"
#include "test_util.h"
#include "transform/device/cpu_executor.h"

namespace ptc::transform::device {
namespace {

using namespace ::ptc::testing;

// Runs `req` over the reference of its layout A and compares with the
// reference of layout B.
void CheckSwitch(const SwitchRequest& req, uint64_t seed) {
  auto plan = MakeSwitchPlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  GlobalValues values(seed);
  std::vector<RankBytes> from = ReferenceLayout(req.spec, req.from, plan->world, req.contents, values);
  std::vector<RankBytes> want = ReferenceLayout(req.spec, req.to, plan->world, req.contents, values);
  std::vector<RankBytes> got = want;
  std::vector<std::vector<const void*>> from_ptrs(plan->world);
  std::vector<std::vector<void*>> to_ptrs(plan->world);
  for (int r = 0; r < plan->world; ++r) {
    ExpectSameBuffers(plan->ranks[r].from, from[r], "layout A rank " + std::to_string(r));
    ExpectSameBuffers(plan->ranks[r].to, want[r], "layout B rank " + std::to_string(r));
    for (auto& d : got[r].data) std::fill(d.begin(), d.end(), kSwitchFill);
    for (auto& d : from[r].data) from_ptrs[r].push_back(d.data());
    for (auto& d : got[r].data) to_ptrs[r].push_back(d.data());
  }
  std::vector<CpuSwitchStats> stats;
  Status s = RunSwitchThreads(*plan, from_ptrs, to_ptrs, &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < plan->world; ++r) {
    for (size_t i = 0; i < want[r].data.size(); ++i) {
      ASSERT_TRUE(got[r].data[i] == want[r].data[i]) << "rank " << r << " " << want[r].names[i] << " differs";
    }
    EXPECT_EQ(stats[r].bytes_sent, plan->ranks[r].bytes_sent) << "rank " << r;
    EXPECT_EQ(stats[r].bytes_received, plan->ranks[r].bytes_received) << "rank " << r;
    EXPECT_LE(stats[r].staging_bytes, req.budget_bytes) << "rank " << r;
    EXPECT_EQ(stats[r].buckets, plan->num_buckets);
  }
}

TEST(SwitchCpu, BitExactAcrossLayoutsDtypesAndBudgets) {
  const uint64_t seed = TestSeed();
  for (const SwitchCase& c : SwitchCases()) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
      for (uint64_t budget : {uint64_t{96}, uint64_t{4096}, uint64_t{64} << 20}) {
        SCOPED_TRACE(c.schema + " " + c.from + " -> " + c.to + " " + std::string(DTypeName(dtype)) + " budget " +
                     std::to_string(budget));
        CheckSwitch(MakeRequest(c, dtype, budget), seed);
      }
    }
  }
}

TEST(SwitchCpu, ThereAndBackAgain) {
  // A -> B -> A gives back A's bytes: two plans, each the other's inverse in effect.
  const uint64_t seed = TestSeed();
  SwitchCase c = SwitchCases()[1];
  SwitchCase back = c;
  std::swap(back.from, back.to);
  CheckSwitch(MakeRequest(c, DType::kBF16, 1024), seed);
  CheckSwitch(MakeRequest(back, DType::kBF16, 1024), seed);
}

TEST(SwitchCpu, GradientsInTheirOwnDtypeAndNoGradients) {
  const uint64_t seed = TestSeed();
  SwitchRequest req = MakeRequest(SwitchCases()[0], DType::kBF16, 2048);
  req.contents.grad_dtype = DType::kF32;
  CheckSwitch(req, seed);
  req.contents.grads = false;
  CheckSwitch(req, seed);
}

TEST(SwitchCpu, RandomLayoutPairs) {
  std::mt19937_64 rng(TestSeed());
  const ModelSpec spec = Spec("llama", "layers=5,hidden=32,heads=8,kv_heads=4,vocab=48,seq=8,ffn=40");
  for (int iter = 0; iter < 12; ++iter) {
    ModelSpec with_optim = spec;
    with_optim.optimizer = iter % 3 == 0;
    SwitchRequest req;
    req.spec = spec;
    req.from = RandomConfig(rng, with_optim);
    req.to = RandomConfig(rng, with_optim);
    req.contents.param_dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    req.contents.grad_dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    req.contents.optimizer = with_optim.optimizer;
    req.ranks_per_host = 1 + static_cast<int>(rng() % 8);
    req.budget_bytes = 64 + rng() % 8192;
    SCOPED_TRACE(req.from.ToString() + " -> " + req.to.ToString() + " " +
                 std::string(DTypeName(req.contents.param_dtype)) + " budget " + std::to_string(req.budget_bytes));
    CheckSwitch(req, rng());
  }
}

TEST(SwitchCpu, WrongBufferCountIsAnError) {
  auto plan = MakeSwitchPlan(MakeRequest(SwitchCases()[0], DType::kBF16, 1 << 20));
  ASSERT_TRUE(plan.ok());
  std::vector<std::vector<const void*>> from(plan->world);
  std::vector<std::vector<void*>> to(plan->world);
  Status s = RunSwitchThreads(*plan, from, to);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("buffers"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ptc::transform::device
