// The dataset through a real mount: data/rank-RRRRR/{ids.txt,samples.idx,
// samples.bin} read by cat and by an independent Python reader, and every
// sample consumed exactly once, in the unchanged run's order, across a
// reconfiguration of dp in the middle of the epoch (ptcfs reconfigure --step).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mount_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr uint64_t kSamples = 1001, kBatch = 37;  // 37 does not divide 1001, nor by 2 or 3

std::vector<uint64_t> ParseIds(const std::string& text) {
  std::vector<uint64_t> ids;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) ids.push_back(std::stoull(line));
  return ids;
}

std::string RankDir(const std::string& mnt, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "/data/rank-%05d", rank);
  return mnt + name;
}

class MountDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testing::RequireFuse(); }

  // A model store in `config` with a synthetic dataset (`extra`: import options).
  void MakeStore(const std::string& config, const std::string& extra = "") {
    const std::string model =
        "--schema megatron-gpt --dims layers=2,hidden=32,heads=4,vocab=128,seq=16 --config " + config;
    for (const std::string& cmd :
         {"synth " + model + " " + tmp_ / "ck", "import " + model + " " + tmp_ / "ck " + tmp_ / "store",
          "data synth --samples " + std::to_string(kSamples) + " --min-len 1 --max-len 50 --vocab 300 " + tmp_ / "ds",
          "data import " + tmp_ / "ds " + tmp_ / "store --global-batch " + std::to_string(kBatch) + " --seed 5 " +
              extra}) {
      auto [code, out] = Ptcfs(cmd);
      ASSERT_EQ(code, 0) << cmd << "\n" << out;
    }
  }

  // The ids each of `dp` ranks consumes in steps [from, to), appended batch by
  // batch in rank order: the global sequence the job trains on.
  static void Consume(const std::vector<std::vector<uint64_t>>& rank_ids, uint64_t from, uint64_t to,
                      std::vector<uint64_t>* out) {
    const int dp = static_cast<int>(rank_ids.size());
    std::vector<size_t> next(dp, 0);
    for (uint64_t step = from; step < to; ++step) {
      const uint64_t in_batch = std::min(kBatch, kSamples - step * kBatch);
      for (int r = 0; r < dp; ++r) {
        const uint64_t part = in_batch / dp + (static_cast<uint64_t>(r) < in_batch % dp);
        for (uint64_t i = 0; i < part; ++i) {
          ASSERT_LT(next[r], rank_ids[r].size()) << "rank " << r << " ran out of ids at step " << step;
          out->push_back(rank_ids[r][next[r]++]);
        }
      }
    }
  }

  TempDir tmp_;
};

TEST_F(MountDataTest, EverySampleOnceAcrossDpChangeMidEpoch) {
  MakeStore("tp=1,pp=1,dp=2");
  // The unchanged run's order: one rank reading the whole epoch.
  auto [code, reference_text] = Ptcfs("data view --config dp=1 --rank 0 --file ids.txt " + tmp_ / "store");
  ASSERT_EQ(code, 0) << reference_text;
  const std::vector<uint64_t> reference = ParseIds(reference_text);
  ASSERT_EQ(reference.size(), kSamples);

  Mount m(tmp_ / "store", tmp_ / "mnt");
  std::vector<uint64_t> consumed;
  {
    std::vector<std::vector<uint64_t>> ids;
    for (int r = 0; r < 2; ++r) {
      const std::string dir = RankDir(m.dir(), r);
      auto [c, cat] = Sh("cat " + dir + "/ids.txt");
      ASSERT_EQ(c, 0) << cat;
      ids.push_back(ParseIds(cat));
      const std::string out = testing::RunMegatronViewReader(tmp_ / "ds", dir);
      EXPECT_NE(out.find("READER OK " + std::to_string(ids.back().size())), std::string::npos) << out;
    }
    EXPECT_EQ(ids[0].size() + ids[1].size(), kSamples);
    Consume(ids, 0, 11, &consumed);
  }
  // Eleven steps later the job moves to three data-parallel ranks.
  auto [rc, rout] = Ptcfs("reconfigure " + m.dir() + " --to tp=1,pp=1,dp=3 --step 11");
  ASSERT_EQ(rc, 0) << rout;
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["dataset"]["step"], 11) << status.dump();
  EXPECT_EQ(status["dataset"]["consumed"], 11 * kBatch);
  {
    std::vector<std::vector<uint64_t>> ids;
    for (int r = 0; r < 3; ++r) {
      const std::string dir = RankDir(m.dir(), r);
      ids.push_back(ParseIds(Slurp(dir + "/ids.txt")));
      const std::string out = testing::RunMegatronViewReader(tmp_ / "ds", dir);
      EXPECT_NE(out.find("READER OK " + std::to_string(ids.back().size())), std::string::npos) << out;
    }
    Consume(ids, 11, (kSamples + kBatch - 1) / kBatch, &consumed);
    EXPECT_EQ(ids[0].size() + ids[1].size() + ids[2].size(), kSamples - 11 * kBatch);  // none left over
  }
  EXPECT_EQ(consumed, reference);                                                    // the unchanged run's sequence ...
  EXPECT_EQ(std::set<uint64_t>(consumed.begin(), consumed.end()).size(), kSamples);  // ... each sample once
  auto [sc, sout] = Ptcfs("data status " + tmp_ / "store");  // the position was committed with the layout
  EXPECT_NE(sout.find("step 11"), std::string::npos) << sout;
}

TEST_F(MountDataTest, StepBeyondTheEpochIsRejectedAndNothingChanges) {
  MakeStore("tp=1,pp=1,dp=2");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  const std::string before = Slurp(RankDir(m.dir(), 1) + "/ids.txt");
  auto [code, out] = Ptcfs("reconfigure " + m.dir() + " --to tp=1,pp=1,dp=3 --step 29");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("step 29 is beyond the end of epoch 0, which has 28 steps"), std::string::npos) << out;
  EXPECT_EQ(testing::WriteConfig(m.dir(), R"({"config": "dp=3", "step": -1})"), EINVAL);
  EXPECT_EQ(testing::WriteConfig(m.dir(), R"({"config": "dp=3", "stpe": 2})"), EINVAL);
  EXPECT_NE(MountStatus(m.dir())["last_error"].get<std::string>().find("unknown field 'stpe'"), std::string::npos);
  const auto status = MountStatus(m.dir());
  EXPECT_EQ(status["config"], "tp=1,pp=1,dp=2,per_worker=8");
  EXPECT_EQ(status["dataset"]["step"], 0);
  EXPECT_EQ(Slurp(RankDir(m.dir(), 1) + "/ids.txt"), before);
  EXPECT_FALSE(std::filesystem::exists(RankDir(m.dir(), 2)));
}

TEST_F(MountDataTest, LengthGroupsHaveADirectoryEach) {
  MakeStore("tp=2,pp=1,dp=2", "--length-buckets 10,30");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  // Ranks 0 and 1 are tp peers of dp rank 0; 2 and 3 of dp rank 1.
  uint64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    for (int g = 0; g < 2; ++g) {
      const std::string dir = RankDir(m.dir(), r) + "/group-" + std::to_string(g);
      const auto ids = ParseIds(Slurp(dir + "/ids.txt"));
      if (r % 2 == 0) total += ids.size();
      const std::string out = testing::RunMegatronViewReader(tmp_ / "ds", dir);
      EXPECT_NE(out.find("READER OK " + std::to_string(ids.size())), std::string::npos) << out;
    }
  }
  EXPECT_EQ(total, kSamples);  // the groups of both dp ranks cover the epoch
}

}  // namespace
}  // namespace ptc
