// The generation writer's rank files with copies (ptc/store/rank_files.h):
// a copy is written as its piece is appended, listed at the commit, verified
// by the piece's checksums, kept by a commit over the same piece and by GC,
// dropped when the piece changes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ptc/store/generation_writer.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

GenerationManifest Meta() {
  GenerationManifest m;
  m.dims = "d";
  m.config = "c";
  m.tensors = {{"w", DType::kF32, {4}}, {"n", DType::kF32, {2}}};
  return m;
}

// Two files of worker 0: A stores w and n, B holds a copy of n.
std::vector<RankFileSpec> Files() {
  RankFileSpec a{0, "rank-00000.model.safetensors", {{0, "HEADER-A"}}, 8 + 16 + 8, {}, {}};
  a.placements = {{"w", {Box{{0}, {4}}}, 8}, {"n", {Box{{0}, {2}}}, 24}};
  RankFileSpec b{0, "rank-00001.model.safetensors", {{0, "HEADER-B"}}, 8 + 8, {}, {}};
  b.copies = {{"n", {Box{{0}, {2}}}, 8}};
  return {a, b};
}

Status Write(GenerationWriter& w, const std::string& tensor, Box box, const std::string& bytes) {
  PTC_ASSIGN_OR_RETURN(auto sink, w.NewShard(tensor, DType::kF32, {box}, 0));
  PTC_RETURN_IF_ERROR(sink->Append(bytes.data(), bytes.size()));
  PTC_ASSIGN_OR_RETURN(ShardRecord r, sink->Finish());
  w.AddShard(std::move(r));
  return Status::OK();
}

class RankFileWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ptcfs_rank_file_writer_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(RankFileWriterTest, CopiesWrittenListedVerifiedKeptAndDropped) {
  const std::string root = dir_ + "/store";
  auto store = Store::Create(Env::Default(), root);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Store& s = **store;
  const std::string w_bytes = "0123456789abcdef", n_bytes = "NNNNnnnn";
  {
    auto w = s.BeginGeneration();
    ASSERT_TRUE(w.ok());
    (*w)->SetRankFiles(Files());
    ASSERT_TRUE(Write(**w, "w", Box{{0}, {4}}, w_bytes).ok());
    ASSERT_TRUE(Write(**w, "n", Box{{0}, {2}}, n_bytes).ok());
    Status c = (*w)->Commit(Meta());
    ASSERT_TRUE(c.ok()) << c.ToString();
  }
  const GenerationManifest g1 = s.current();  // a copy: the next commit replaces it
  ASSERT_EQ(g1.rank_file_copies.size(), 1u);
  EXPECT_EQ(g1.rank_file_copies[0].file, "gen-000001/worker-00/rank-00001.model.safetensors");
  EXPECT_EQ(g1.rank_file_copies[0].copies, (std::vector<CopyRecord>{{"n", {Box{{0}, {2}}}, 8}}));
  EXPECT_EQ(Slurp(root + "/gen-000001/worker-00/rank-00000.model.safetensors"), "HEADER-A" + w_bytes + n_bytes);
  EXPECT_EQ(Slurp(root + "/gen-000001/worker-00/rank-00001.model.safetensors"), "HEADER-B" + n_bytes);
  ASSERT_TRUE(VerifyGeneration(s, g1).ok());
  ASSERT_EQ(CopyRecords(g1).size(), 1u);

  // A commit over the same pieces (a dataset advance) keeps the copies; GC keeps their file.
  {
    auto w = s.BeginGeneration();
    ASSERT_TRUE(w.ok());
    for (const ShardRecord& r : s.current().shards) (*w)->AddShard(r);
    GenerationManifest meta = s.current();
    meta.extra["dataset"] = 1;
    ASSERT_TRUE((*w)->Commit(meta).ok());
  }
  EXPECT_EQ(s.current().rank_file_copies, g1.rank_file_copies);
  ASSERT_TRUE(s.CollectGarbage({}).ok());
  EXPECT_TRUE(fs::exists(root + "/gen-000001/worker-00/rank-00001.model.safetensors"));
  EXPECT_TRUE(VerifyGeneration(s, s.current()).ok());

  // A damaged copy byte fails verification, naming the rank file.
  {
    std::fstream f(root + "/gen-000001/worker-00/rank-00001.model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.put('x');
  }
  Status bad = VerifyGeneration(s, s.current());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("rank-00001.model.safetensors"), std::string::npos) << bad.ToString();
  EXPECT_NE(bad.message().find("a copy in a rank file"), std::string::npos) << bad.ToString();

  // New bytes for n (a save): the copy no longer holds them and is dropped; GC removes its file.
  {
    auto w = s.BeginGeneration();
    ASSERT_TRUE(w.ok());
    for (const ShardRecord& r : s.current().shards) {
      if (r.tensor == "w") (*w)->AddShard(r);
    }
    ASSERT_TRUE(Write(**w, "n", Box{{0}, {2}}, "MMMMmmmm").ok());
    ASSERT_TRUE((*w)->Commit(s.current()).ok());
  }
  EXPECT_TRUE(s.current().rank_file_copies.empty());
  ASSERT_TRUE(s.CollectGarbage({}).ok());
  EXPECT_FALSE(fs::exists(root + "/gen-000001/worker-00/rank-00001.model.safetensors"));
  EXPECT_TRUE(fs::exists(root + "/gen-000001/worker-00/rank-00000.model.safetensors"));  // w lies there
  EXPECT_TRUE(VerifyGeneration(s, s.current()).ok());
}

}  // namespace
}  // namespace ptc
