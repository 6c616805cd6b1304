// Saves into the mount's dcp/ without torch (issue 28): a DCP checkpoint
// written the way dcp.save writes one (chunk files, .metadata.tmp, then a
// rename onto .metadata) by `cp` and `mv` commits a generation, which the
// mount's files show (cmp against synth of the saved values); what is no
// checkpoint is refused at the rename (EIO), naming the chunk, with the
// generation unchanged; a save that never lands its .metadata commits
// nothing. (torch's own dcp.save through the mount: clients_test.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "mount_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

const std::string kModel = "--schema llama --dims layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16";

class MountDcpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RequireFuse(); }
  void SetUp() override {
    // The store holds seed 1; the checkpoint to save holds seed 2 (a DCP export of it).
    for (int seed : {1, 2}) {
      const std::string s = std::to_string(seed);
      Run("synth " + kModel + " --optimizer adam --dtype bf16 --seed " + s + " --config tp=2,pp=2 " +
          tmp_ / ("src" + s));
      Run("import " + kModel + " --config tp=2,pp=2 " + tmp_ / ("src" + s) + " " + tmp_ / ("store" + s));
    }
    Run("export --format dcp " + tmp_ / "store2 " + tmp_ / "ckpt");
  }
  void Run(const std::string& args) {
    auto [code, out] = Ptcfs(args);
    ASSERT_EQ(code, 0) << args << "\n" << out;
  }
  // As dcp.save writes: the chunk files, .metadata.tmp, then the rename (rename(2), whose
  // error Python reports as torch's FileSystemWriter would meet it).
  std::pair<int, std::string> Save(const std::string& mnt, const std::string& name, const std::string& from) {
    const std::string dir = mnt + "/dcp/" + name;
    return Sh("mkdir " + dir + " && cp " + from + "/__*.distcp " + dir + "/ && cp " + from + "/.metadata " + dir +
              "/.metadata.tmp && " + Rename(dir + "/.metadata.tmp", dir + "/.metadata"));
  }
  static std::string Rename(const std::string& from, const std::string& to) {
    return "/usr/bin/python3 -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' " + from + " " + to + " 2>&1";
  }
  TempDir tmp_;
};

TEST_F(MountDcpTest, ASaveCommitsAndTheMountShowsItInAnyLayout) {
  Mount m(tmp_ / "store1", tmp_ / "mnt", "--format all");
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  auto [code, out] = Save(m.dir(), "step-100", tmp_ / "ckpt");
  ASSERT_EQ(code, 0) << out;
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], generation + 1) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  // Committed: no longer staged, and dcp/step-100 is the committed state under the name it
  // was saved as (issue 41, item 9: a job looking for its latest step directory resumes).
  EXPECT_FALSE(fs::exists(tmp_ / "store1/ingest/.dcp/step-100"));
  EXPECT_EQ(Slurp(m.dir() + "/dcp/step-100/.metadata"), Slurp(m.dir() + "/dcp/.metadata"));
  std::tie(code, out) = Sh("rm -r " + m.dir() + "/dcp/step-100 2>&1");
  EXPECT_NE(code, 0) << "the committed state is no save to remove: " << out;
  // The mount's rank files and its dcp/ now hold the saved values.
  Run("synth " + kModel + " --optimizer adam --dtype bf16 --seed 2 --config tp=1,pp=2 " + tmp_ / "want");
  Run("reconfigure " + m.dir() + " --to tp=1,pp=2");
  for (const char* rank : {"rank-00000", "rank-00001"}) {
    for (const char* file : {"model.safetensors", "optim.safetensors"}) {
      const std::string rel = std::string("/") + rank + "/" + file;
      auto [cmp, cmp_out] = Sh("cmp " + m.dir() + "/model" + rel + " " + tmp_ / "want" + rel + " 2>&1");
      EXPECT_EQ(cmp, 0) << rel << ": " << cmp_out;
    }
  }
  std::tie(code, out) = Sh("cmp " + m.dir() + "/dcp/.metadata " + tmp_ / "ckpt/.metadata 2>&1");
  EXPECT_EQ(code, 0) << out;  // the saved pieces are cut as the export's were
}

TEST_F(MountDcpTest, WhatIsNoCheckpointIsRefusedAtTheRenameAndChangesNothing) {
  Mount m(tmp_ / "store1", tmp_ / "mnt", "--format dcp");
  const auto before = MountStatus(m.dir());
  // A chunk file shorter than its chunks: refused naming the chunk; the staged files stay.
  fs::copy(tmp_ / "ckpt", tmp_ / "short", fs::copy_options::recursive);
  fs::resize_file(tmp_ / "short/__0_0.distcp", 1000);
  auto [code, out] = Save(m.dir(), "short", tmp_ / "short");
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(Contains(out, "Input/output error")) << out;
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], before["generation"]) << status.dump();
  EXPECT_TRUE(Contains(status["last_error"].get<std::string>(), "lies past the end of the file")) << status.dump();
  EXPECT_TRUE(Contains(status["last_error"].get<std::string>(), "key model.embedding.word_embeddings.weight"))
      << status.dump();
  EXPECT_TRUE(fs::exists(m.dir() + "/dcp/short/.metadata"));
  // A .metadata that is no pickle DCP wrote.
  std::tie(code, out) = Sh("mkdir " + m.dir() + "/dcp/junk && echo junk > " + m.dir() + "/dcp/junk/.metadata.tmp && " +
                           Rename(m.dir() + "/dcp/junk/.metadata.tmp", m.dir() + "/dcp/junk/.metadata"));
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(Contains(out, "Input/output error")) << out;
  EXPECT_TRUE(Contains(MountStatus(m.dir())["last_error"].get<std::string>(), "junk/.metadata")) << out;
  EXPECT_EQ(MountStatus(m.dir())["generation"], before["generation"]);
  // A save that never lands its .metadata commits nothing, and survives a reconfigure.
  std::tie(code, out) =
      Sh("mkdir " + m.dir() + "/dcp/pending && cp " + tmp_ / "ckpt/__0_0.distcp " + m.dir() + "/dcp/pending/ 2>&1");
  ASSERT_EQ(code, 0) << out;
  Run("reconfigure " + m.dir() + " --to tp=1,pp=1");
  WaitServing(m.dir());
  EXPECT_TRUE(fs::exists(m.dir() + "/dcp/pending/__0_0.distcp"));
  // The refused and pending saves are removed as any directory; then a good one commits.
  std::tie(code, out) = Sh("rm -r " + m.dir() + "/dcp/short " + m.dir() + "/dcp/junk " + m.dir() + "/dcp/pending 2>&1");
  EXPECT_EQ(code, 0) << out;
  const int generation = MountStatus(m.dir())["generation"].get<int>();
  std::tie(code, out) = Save(m.dir(), "good", tmp_ / "ckpt");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(MountStatus(m.dir())["generation"], generation + 1);
  // dcp/ takes directories only; megatron/ keeps dcp/'s staging name to itself.
  std::tie(code, out) = Sh("touch " + m.dir() + "/dcp/file 2>&1");
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(Contains(out, "Permission denied")) << out;
}

TEST_F(MountDcpTest, MegatronDoesNotShowOrMakeDcpStaging) {
  Mount m(tmp_ / "store1", tmp_ / "mnt", "--format all");
  ASSERT_EQ(Sh("mkdir " + m.dir() + "/dcp/pending").first, 0);
  auto [code, out] = Sh("ls -a " + m.dir() + "/megatron");
  EXPECT_FALSE(Contains(out, ".dcp")) << out;
  std::tie(code, out) = Sh("mkdir " + m.dir() + "/megatron/.dcp 2>&1");
  EXPECT_NE(code, 0) << out;
}

}  // namespace
}  // namespace ptc
