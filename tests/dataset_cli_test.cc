// `ptcfs data` end to end: synth, import, status, advance, view; every bad
// input gives a clear message and leaves the store byte for byte unchanged.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct CmdResult {
  int code;
  std::string out;
};

CmdResult Ptcfs(const std::string& args, bool merge_stderr = true) {
  const std::string cmd = std::string(PTCFS_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Spit(const fs::path& p, const std::string& data) { std::ofstream(p, std::ios::binary) << data; }

std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? Slurp(e.path()) : "<dir>";
  }
  return files;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class DataCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CmdResult r = Ptcfs("data synth --samples 500 --min-len 1 --max-len 64 --vocab 1000 --seed 4 " + tmp_ / "d");
    ASSERT_EQ(r.code, 0) << r.out;
    r = Ptcfs("data import --format megatron " + tmp_ / "d" + " " + tmp_ / "store" + " --global-batch 24 --seed 9");
    ASSERT_EQ(r.code, 0) << r.out;
    before_ = Snapshot(tmp_ / "store");
  }
  // A damaged copy of the dataset at tmp/bad.{idx,bin}.
  std::string Damaged(const std::function<void(std::string& idx, std::string& bin)>& damage) {
    std::string idx = Slurp(tmp_ / "d.idx"), bin = Slurp(tmp_ / "d.bin");
    damage(idx, bin);
    Spit(tmp_ / "bad.idx", idx);
    Spit(tmp_ / "bad.bin", bin);
    return tmp_ / "bad";
  }
  void ExpectUnchanged() { EXPECT_EQ(Snapshot(tmp_ / "store"), before_); }

  TempDir tmp_;
  std::map<std::string, std::string> before_;
};

TEST_F(DataCliTest, StatusJson) {
  CmdResult r = Ptcfs("data status --json " + tmp_ / "store", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dataset"]["samples"], 500);
  EXPECT_EQ(j["dataset"]["global_batch"], 24);
  EXPECT_EQ(j["steps_per_epoch"], 21);
  EXPECT_EQ(j["step"], 0);
  r = Ptcfs("data status " + tmp_ / "store");
  EXPECT_NE(r.out.find("21 steps per epoch"), std::string::npos) << r.out;
}

// dp = 1 from step 0 is the global order; after advancing to step 5, the dp = 5
// ranks' ids.txt, cut batch by batch, concatenate to the same order.
TEST_F(DataCliTest, ViewsFollowTheGlobalOrderAcrossDpChanges) {
  CmdResult whole = Ptcfs("data view --config dp=1 --rank 0 --file ids.txt " + tmp_ / "store", false);
  ASSERT_EQ(whole.code, 0);
  const std::vector<std::string> order = Lines(whole.out);
  ASSERT_EQ(order.size(), 500u);
  ASSERT_EQ(Ptcfs("data advance --step 5 " + tmp_ / "store").code, 0);
  std::vector<std::vector<std::string>> ranks;
  for (int r = 0; r < 5; ++r) {
    // tp=2: ranks 2r and 2r+1 share a dp index.
    CmdResult v =
        Ptcfs("data view --config tp=2,dp=5 --rank " + std::to_string(2 * r + 1) + " --file ids.txt " + tmp_ / "store",
              false);
    ASSERT_EQ(v.code, 0);
    ranks.push_back(Lines(v.out));
  }
  std::vector<std::string> consumed;
  std::vector<size_t> next(5, 0);
  for (uint64_t k = 5; k < 21; ++k) {
    const uint64_t len = std::min<uint64_t>(24, 500 - k * 24);
    for (uint64_t r = 0; r < 5; ++r) {
      for (uint64_t c = len / 5 + (r < len % 5); c > 0; --c) consumed.push_back(ranks[r][next[r]++]);
    }
  }
  EXPECT_EQ(consumed, std::vector<std::string>(order.begin() + 120, order.end()));
  CmdResult bin = Ptcfs("data view --config dp=5 --rank 4 --file samples.bin " + tmp_ / "store", false);
  CmdResult idx = Ptcfs("data view --config dp=5 --rank 4 --file samples.idx " + tmp_ / "store", false);
  ASSERT_EQ(idx.out.size(), 34 + 20 * ranks[4].size() + 8);
  int64_t last_offset;
  int32_t last_len;
  std::memcpy(&last_len, idx.out.data() + 34 + 4 * (ranks[4].size() - 1), 4);
  std::memcpy(&last_offset, idx.out.data() + 34 + 4 * ranks[4].size() + 8 * (ranks[4].size() - 1), 8);
  EXPECT_EQ(bin.out.size(), static_cast<size_t>(last_offset + 2 * last_len));
}

TEST_F(DataCliTest, BadIndexFilesAreRejected) {
  struct Case {
    std::function<void(std::string&, std::string&)> damage;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](std::string& idx, std::string&) { idx.resize(idx.size() - 9); }, "bad.idx: truncated"},
      {[](std::string& idx, std::string&) { idx.resize(20); }, "bad.idx: truncated: 20 bytes"},
      {[](std::string& idx, std::string&) { idx[1] = 'X'; }, "bad.idx: wrong magic"},
      {[](std::string&, std::string& bin) { bin.resize(bin.size() - 2); }, "past the end of the .bin"},
      {[](std::string& idx, std::string&) { idx[18] = static_cast<char>(499 & 0xff); }, "count mismatch"},
  };
  for (const Case& c : cases) {
    const std::string bad = Damaged(c.damage);
    // Into the existing store, and into a store that does not exist yet.
    CmdResult r = Ptcfs("data import --format megatron " + bad + " " + tmp_ / "store" + " --global-batch 24");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    r = Ptcfs("data import --format megatron " + bad + " " + tmp_ / "new" + " --global-batch 24");
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(tmp_ / "new")) << "a failed import left a store behind";
    fs::create_directory(tmp_ / "empty");
    r = Ptcfs("data import --format megatron " + bad + " " + tmp_ / "empty" + " --global-batch 24");
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_TRUE(fs::is_empty(tmp_ / "empty")) << "a failed import left files in an empty directory";
    ExpectUnchanged();
  }
}

TEST_F(DataCliTest, MismatchedFingerprintOnReimport) {
  ASSERT_EQ(Ptcfs("data synth --samples 500 --min-len 1 --max-len 64 --vocab 1000 --seed 5 " + tmp_ / "d").code, 0);
  CmdResult r = Ptcfs("data import --format megatron " + tmp_ / "d" + " " + tmp_ / "store" + " --global-batch 24");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("dataset fingerprint mismatch"), std::string::npos) << r.out;
  ExpectUnchanged();
  r = Ptcfs("data view --config dp=2 --rank 0 --file ids.txt " + tmp_ / "store");
  EXPECT_NE(r.out.find("dataset fingerprint mismatch"), std::string::npos) << r.out;
}

TEST_F(DataCliTest, StepBeyondTheEpoch) {
  CmdResult r = Ptcfs("data advance --step 22 " + tmp_ / "store");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("step 22 is beyond the end of epoch 0, which has 21 steps"), std::string::npos) << r.out;
  ExpectUnchanged();
  r = Ptcfs("data view --config dp=2 --rank 0 --file ids.txt --step 22 " + tmp_ / "store");
  EXPECT_NE(r.out.find("beyond the end of epoch 0"), std::string::npos) << r.out;
  r = Ptcfs("data view --config dp=2 --rank 2 --file ids.txt " + tmp_ / "store");
  EXPECT_NE(r.out.find("--rank 2 is outside [0, 2)"), std::string::npos) << r.out;
  r = Ptcfs("data view --config dp=2 --rank 0 --file samples.jsonl " + tmp_ / "store");
  EXPECT_NE(r.out.find("has no samples.jsonl"), std::string::npos) << r.out;
  r = Ptcfs("data import --format megatron " + tmp_ / "d" + " " + tmp_ / "store" +
            " --global-batch 24 --seed 9 "
            "--length-buckets 9,3");
  EXPECT_NE(r.out.find("strictly ascending"), std::string::npos) << r.out;
  ExpectUnchanged();
  // The next epoch is explicit.
  ASSERT_EQ(Ptcfs("data advance --epoch 1 --step 0 " + tmp_ / "store").code, 0);
  EXPECT_NE(Ptcfs("data status " + tmp_ / "store").out.find("epoch 1, step 0"), std::string::npos);
}

TEST_F(DataCliTest, JsonlEndToEnd) {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "{\"id\":" + std::to_string(i) + "}\n";
  Spit(tmp_ / "x.jsonl", text);
  CmdResult r = Ptcfs("data import --format jsonl " + tmp_ / "x.jsonl" + " " + tmp_ / "js" + " --global-batch 4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptcfs("data view --config dp=3 --rank 1 --file samples.jsonl --step 2 " + tmp_ / "js", false);
  CmdResult ids = Ptcfs("data view --config dp=3 --rank 1 --file ids.txt --step 2 " + tmp_ / "js", false);
  const auto lines = Lines(r.out), id_lines = Lines(ids.out);
  ASSERT_EQ(lines.size(), id_lines.size());
  ASSERT_FALSE(lines.empty());
  for (size_t j = 0; j < lines.size(); ++j)
    EXPECT_EQ(lines[j], "{\"id\":" + std::to_string(std::stoi(id_lines[j])) + "}");
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

// Tensors and the dataset position live in one manifest: importing a model
// checkpoint, and transforming it, keeps the dataset state.
TEST(DataAndModel, ModelImportAndTransformKeepTheDatasetState) {
  testing::TempDir tmp;
  auto run = [](const std::string& args) { return testing::Ptcfs(args); };
  ASSERT_EQ(run("data synth --samples 100 --min-len 1 --max-len 8 --vocab 50 " + tmp / "d").first, 0);
  ASSERT_EQ(run("data import --format megatron " + tmp / "d" + " " + tmp / "store --global-batch 8").first, 0);
  ASSERT_EQ(run("data advance --step 3 " + tmp / "store").first, 0);
  const std::string dims = "layers=2,hidden=16,heads=2,vocab=32,seq=4";
  ASSERT_EQ(run("synth --schema megatron-gpt --dims " + dims + " --config tp=2 " + tmp / "ckpt").first, 0);
  auto r = run("import --schema megatron-gpt --dims " + dims + " --config tp=2 " + tmp / "ckpt " + tmp / "store");
  ASSERT_EQ(r.first, 0) << r.second;
  ASSERT_EQ(run("transform " + tmp / "store --to tp=1").first, 0);
  auto status = run("data status --json " + tmp / "store");
  ASSERT_EQ(status.first, 0) << status.second;
  EXPECT_EQ(nlohmann::json::parse(status.second)["step"], 3) << status.second;
}

}  // namespace
}  // namespace ptc
