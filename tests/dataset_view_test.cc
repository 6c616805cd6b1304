// A rank's rendered view: ids.txt, samples.idx and samples.bin are read back by
// an independent reader in Python (numpy), whose tokens must equal the source's
// samples; any byte range reads the same as the whole file; JSONL views give
// the source's lines.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "ptc/dataset/synth.h"
#include "ptc/dataset/view.h"
#include "test_util.h"

namespace ptc {
namespace {

// Reads a whole view file in random-sized chunks (random access from the start).
std::string ReadAll(const RankDataView& v, ViewFile f, std::mt19937_64& rng) {
  const uint64_t size = *v.FileSize(f);
  std::string out(size, '\0');
  for (uint64_t off = 0; off < size;) {
    const size_t n = 1 + rng() % 5000;
    auto got = v.Read(f, off, n, out.data() + off);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok() || *got == 0) break;
    off += *got;
  }
  return out;
}

class DatasetViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = {.samples = 3001, .min_len = 0, .max_len = 40, .vocab = 70000, .seed = 9};  // i32 tokens
    ASSERT_TRUE(WriteSynthDataset(env_, spec_, tmp_ / "d").ok());
    store_ = std::move(Store::Create(env_, tmp_ / "store")).value();
  }
  void Import(std::vector<uint64_t> buckets = {}) {
    DatasetImportOptions o{.format = DatasetFormat::kMegatron,
                           .source = tmp_ / "d",
                           .global_batch = 37,
                           .seed = 11,
                           .length_buckets = std::move(buckets)};
    ASSERT_TRUE(ImportDataset(*store_, o).ok());
    state_ = **LoadDatasetState(*store_);
    source_ = std::move(OpenDatasetSource(env_, *store_, state_)).value();
  }
  std::unique_ptr<RankDataView> View(const DatasetState& s, int dp, int rank, std::optional<size_t> group = {}) {
    auto samples = RankSamplesFor(s, source_, dp, rank, group);
    EXPECT_TRUE(samples.ok()) << samples.status().ToString();
    return std::make_unique<RankDataView>(source_, *samples);
  }
  // Renders the three files into DIR and runs the reader on them.
  void CheckWithReader(const RankDataView& v, const std::string& name, std::mt19937_64& rng) {
    const std::string dir = tmp_ / name;
    std::filesystem::create_directories(dir);
    for (ViewFile f : {ViewFile::kIds, ViewFile::kIdx, ViewFile::kBin}) {
      testing::Spit(dir + "/" + std::string(ViewFileName(f)), ReadAll(v, f, rng));
    }
    const std::string out = testing::RunMegatronViewReader(tmp_ / "d", dir);
    EXPECT_NE(out.find("READER OK " + std::to_string(v.num_samples())), std::string::npos) << out;
  }

  Env* env_ = Env::Default();
  testing::TempDir tmp_;
  SynthDatasetSpec spec_;
  std::unique_ptr<Store> store_;
  DatasetState state_;
  std::shared_ptr<const DatasetSource> source_;
};

TEST_F(DatasetViewTest, PythonReaderSeesTheSourceSamples) {
  Import();
  std::mt19937_64 rng(testing::TestSeed());
  struct Case {
    uint64_t step;
    int dp, rank;
  };
  for (const Case& c : std::vector<Case>{{0, 1, 0}, {0, 3, 2}, {17, 5, 0}, {40, 8, 7}, {81, 2, 1}, {82, 4, 0}}) {
    DatasetState s = *StateAtStep(state_, c.step);
    auto v = View(s, c.dp, c.rank);
    CheckWithReader(*v, "view-" + std::to_string(c.step) + "-" + std::to_string(c.dp) + "-" + std::to_string(c.rank),
                    rng);
  }
}

TEST_F(DatasetViewTest, IdsAreTheRankStreamAndRanksCoverTheRestOnce) {
  Import();
  DatasetState s = *StateAtStep(state_, 30);
  std::mt19937_64 rng(testing::TestSeed());
  std::multiset<uint64_t> all;
  const int dp = 7;  // does not divide 37
  for (int r = 0; r < dp; ++r) {
    auto v = View(s, dp, r);
    const std::string ids = ReadAll(*v, ViewFile::kIds, rng);
    ASSERT_EQ(ids.size() % 5, 0u);  // 3001 samples: ids are 4 digits + '\n'
    std::istringstream in(ids);
    RankStream stream = *RankStream::Create({s.num_samples, s.global_batch}, s.consumed, dp, r);
    Permutation perm(s.num_samples, s.seed, s.epoch);
    uint64_t j = 0;
    for (std::string line; std::getline(in, line); ++j) {
      ASSERT_EQ(line.size(), 4u);
      ASSERT_EQ(std::stoull(line), perm(stream.Position(j)));
      all.insert(std::stoull(line));
    }
    ASSERT_EQ(j, stream.size());
  }
  ASSERT_EQ(all.size(), s.num_samples - s.consumed);
  EXPECT_EQ(std::set<uint64_t>(all.begin(), all.end()).size(), all.size()) << "a sample twice";
}

TEST_F(DatasetViewTest, AnyRangeReadsLikeTheWholeFile) {
  Import();
  std::mt19937_64 rng(testing::TestSeed());
  auto v = View(*StateAtStep(state_, 3), 3, 1);
  for (ViewFile f : {ViewFile::kIds, ViewFile::kIdx, ViewFile::kBin}) {
    const std::string whole = ReadAll(*v, f, rng);
    for (int t = 0; t < 300; ++t) {
      const uint64_t a = rng() % (whole.size() + 10), n = rng() % 3000;
      std::string got(n, '\0');
      auto r = v->Read(f, a, n, got.data());
      ASSERT_TRUE(r.ok());
      got.resize(*r);
      ASSERT_EQ(got, a < whole.size() ? whole.substr(a, n) : "") << ViewFileName(f) << " " << a << "+" << n;
    }
  }
  EXPECT_FALSE(v->Offers(ViewFile::kJsonl));
  EXPECT_EQ(v->FileSize(ViewFile::kJsonl).status().code(), Code::kInvalidArgument);
}

TEST_F(DatasetViewTest, EndOfEpochViewIsEmpty) {
  Import();
  auto v = View(*StateAtStep(state_, state_.steps_per_epoch()), 4, 3);
  EXPECT_EQ(*v->FileSize(ViewFile::kIds), 0u);
  EXPECT_EQ(*v->FileSize(ViewFile::kBin), 0u);
  EXPECT_EQ(*v->FileSize(ViewFile::kIdx), 34u + 8u);
  char c;
  EXPECT_EQ(*v->Read(ViewFile::kBin, 0, 1, &c), 0u);
}

TEST_F(DatasetViewTest, LengthGroupsPerRank) {
  Import({10, 25});
  std::mt19937_64 rng(testing::TestSeed());
  EXPECT_NE(RankSamplesFor(state_, source_, 2, 0, {}).status().message().find("name the group"), std::string::npos);
  EXPECT_FALSE(RankSamplesFor(state_, source_, 2, 0, 2).ok());
  DatasetState s = *StateAtStep(state_, 12);
  uint64_t total = 0;
  const int dps[] = {4, 2};
  for (size_t g = 0; g < 2; ++g) {
    for (int r = 0; r < dps[g]; ++r) {
      auto v = View(s, dps[g], r, g);
      total += v->num_samples();
      for (uint64_t j = 0; j < v->num_samples(); j += 7) {
        const uint64_t len = source_->SampleLength(RankSamplesFor(s, source_, dps[g], r, g).value()->At(j));
        ASSERT_EQ(GroupOf(s.length_buckets, len), g);
      }
      if (r == 0) CheckWithReader(*v, "group-" + std::to_string(g), rng);
    }
  }
  EXPECT_EQ(total, s.num_samples - s.consumed);
}

TEST_F(DatasetViewTest, JsonlViewGivesTheLines) {
  std::string text;
  std::vector<std::string> lines;
  for (int i = 0; i < 500; ++i) {
    lines.push_back("{\"i\":" + std::to_string(i) + ",\"pad\":\"" + std::string(i % 13, 'x') + "\"}");
    text += lines.back() + (i % 50 == 0 ? "\r\n\n" : "\n");
  }
  testing::Spit(tmp_ / "x.jsonl", text);
  DatasetImportOptions o{
      .format = DatasetFormat::kJsonl, .source = tmp_ / "x.jsonl", .global_batch = 16, .seed = 1, .length_buckets = {}};
  auto imported = ImportDataset(*store_, o);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  source_ = std::move(OpenDatasetSource(env_, *store_, imported->state)).value();
  DatasetState s = *StateAtStep(imported->state, 9);
  std::mt19937_64 rng(testing::TestSeed());
  auto v = View(s, 3, 2);
  EXPECT_FALSE(v->Offers(ViewFile::kBin));
  std::istringstream ids(ReadAll(*v, ViewFile::kIds, rng)), jsonl(ReadAll(*v, ViewFile::kJsonl, rng));
  std::string id, line;
  uint64_t count = 0;
  while (std::getline(ids, id)) {
    ASSERT_TRUE(std::getline(jsonl, line));
    ASSERT_EQ(line, lines[std::stoull(id)]);
    ++count;
  }
  EXPECT_FALSE(std::getline(jsonl, line));
  EXPECT_EQ(count, v->num_samples());
  EXPECT_GT(count, 0u);
}

}  // namespace
}  // namespace ptc
