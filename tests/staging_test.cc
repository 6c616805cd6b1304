// The mount's staging area (fs/staging.h) never follows a symbolic link
// (issue 41, item 1): a link planted at STORE/ingest, at STORE/ingest/.dcp or
// below used to be followed, so that a save staged into, listed and removed an
// outside directory. Each operation is tried through a link at the root, at a
// directory inside and at the last name; the outside tree must be unchanged.
// The mount's view of the same is in mount_hostile_test.cc.
#include "fs/staging.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    outside_ = tmp_ / "outside";
    fs::create_directories(outside_ + "/iter_0000005");
    Spit(outside_ + "/a", "keep me");
    Spit(outside_ + "/iter_0000005/model.pt", "keep me too");
    fs::create_directories(tmp_ / "store");
  }
  // The outside tree is as SetUp made it.
  void ExpectOutsideUnchanged() {
    EXPECT_EQ(Slurp(outside_ + "/a"), "keep me");
    EXPECT_EQ(Slurp(outside_ + "/iter_0000005/model.pt"), "keep me too");
    size_t entries = 0;
    for (auto it = fs::recursive_directory_iterator(outside_); it != fs::recursive_directory_iterator(); ++it)
      ++entries;
    EXPECT_EQ(entries, 3u) << "something was made in " << outside_;
  }
  static void ExpectLinkRefused(const Status& s, const std::string& path) {
    EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), path + ": a symbolic link")) << s.message();
  }
  TempDir tmp_;
  std::string outside_;
};

TEST_F(StagingTest, ARootThatIsALinkIsNeverFollowed) {
  const std::string root = tmp_ / "store/ingest";
  fs::create_directory_symlink(outside_, root);
  ptcfs::Staging staging(root);
  EXPECT_TRUE(staging.List("").empty());
  EXPECT_TRUE(staging.List("iter_0000005").empty());
  ExpectLinkRefused(staging.Mkdir("iter_0000009"), root);
  ExpectLinkRefused(staging.Open("a", O_WRONLY | O_TRUNC).status(), root);
  ExpectLinkRefused(staging.Open("new", O_WRONLY | O_CREAT).status(), root);
  ExpectLinkRefused(staging.Stat("a").status(), root);
  ExpectLinkRefused(staging.Unlink("a"), root);
  ExpectLinkRefused(staging.Rmdir("iter_0000005"), root);
  ExpectLinkRefused(staging.Rename("a", "b"), root);
  ExpectLinkRefused(staging.Truncate("a", 0), root);
  ExpectLinkRefused(staging.RemoveTree("iter_0000005"), root);
  ExpectOutsideUnchanged();
  EXPECT_TRUE(fs::is_symlink(root));
}

TEST_F(StagingTest, ALinkInsideIsNeverFollowed) {
  const std::string root = tmp_ / "store/ingest";
  ptcfs::Staging staging(root);
  ASSERT_TRUE(staging.Mkdir("iter_0000001").ok());
  fs::create_directory_symlink(outside_, root + "/.dcp");
  fs::create_symlink(outside_ + "/a", root + "/iter_0000001/model.pt");
  // Listed as nothing: the link at .dcp is not a directory of the area, the
  // link to a file is no staged file.
  EXPECT_TRUE(staging.List(".dcp").empty());
  EXPECT_TRUE(staging.List(".dcp/iter_0000005").empty());
  EXPECT_TRUE(staging.List("iter_0000001").empty());
  for (const auto& [name, is_dir] : staging.List("")) EXPECT_NE(name, ".dcp");
  ExpectLinkRefused(staging.Mkdir(".dcp/x"), root + "/.dcp");
  ExpectLinkRefused(staging.Open(".dcp/a", O_RDWR).status(), root + "/.dcp");
  ExpectLinkRefused(staging.Open(".dcp/new", O_WRONLY | O_CREAT).status(), root + "/.dcp");
  ExpectLinkRefused(staging.Unlink(".dcp/a"), root + "/.dcp");
  ExpectLinkRefused(staging.RemoveTree(".dcp/iter_0000005"), root + "/.dcp");
  ExpectLinkRefused(staging.Rename(".dcp/a", "iter_0000001/a"), root + "/.dcp");
  ExpectLinkRefused(staging.Rename("iter_0000001/model.pt", ".dcp/b"), root + "/.dcp");
  // The last name a link: opened never (written or truncated through), stat'ed as the link.
  const std::string link = root + "/iter_0000001/model.pt";
  ExpectLinkRefused(staging.Open("iter_0000001/model.pt", O_WRONLY | O_TRUNC).status(), link);
  ExpectLinkRefused(staging.Open("iter_0000001/model.pt", O_WRONLY | O_CREAT | O_TRUNC).status(), link);
  ExpectLinkRefused(staging.Truncate("iter_0000001/model.pt", 0), link);
  ASSERT_TRUE(staging.Stat("iter_0000001/model.pt").ok());
  EXPECT_TRUE(S_ISLNK(staging.Stat("iter_0000001/model.pt")->st_mode));
  ExpectOutsideUnchanged();
  // Removing the tree (a commit's cleanup) and the link names remove the links themselves.
  EXPECT_TRUE(staging.RemoveTree("iter_0000001").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/iter_0000001")));
  EXPECT_TRUE(staging.RemoveTree(".dcp").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/.dcp")));
  ExpectOutsideUnchanged();
}

TEST_F(StagingTest, PlainOperationsWork) {
  const std::string root = tmp_ / "store/ingest";
  ptcfs::Staging staging(root);
  EXPECT_TRUE(staging.List("").empty());
  EXPECT_EQ(staging.RemoveTree("absent").code(), Code::kOk);
  ASSERT_TRUE(staging.Mkdir(".dcp").ok());  // the root is made first
  ASSERT_TRUE(staging.Mkdir(".dcp/save").ok());
  EXPECT_EQ(staging.Mkdir(".dcp/save").code(), Code::kAlreadyExists);
  Result<int> fd = staging.Open(".dcp/save/__0_0.distcp", O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_EQ(write(*fd, "0123456789", 10), 10);
  close(*fd);
  ASSERT_TRUE(staging.Truncate(".dcp/save/__0_0.distcp", 4).ok());
  EXPECT_EQ(Slurp(root + "/.dcp/save/__0_0.distcp"), "0123");
  ASSERT_TRUE(staging.Rename(".dcp/save/__0_0.distcp", ".dcp/save/.metadata").ok());
  EXPECT_EQ(staging.Stat(".dcp/save/.metadata")->st_size, 4);
  EXPECT_EQ(staging.Stat(".dcp/save/__0_0.distcp").status().code(), Code::kNotFound);
  const auto entries = staging.List(".dcp");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0], std::make_pair(std::string("save"), true));
  EXPECT_FALSE(staging.Rmdir(".dcp/save").ok());  // not empty
  EXPECT_EQ(staging.Unlink(".dcp/save/..").code(), Code::kInvalidArgument);
  ASSERT_TRUE(staging.RemoveTree(".dcp/save").ok());
  EXPECT_FALSE(fs::exists(root + "/.dcp/save"));
  ASSERT_TRUE(staging.Rmdir(".dcp").ok());
}

}  // namespace
}  // namespace ptc
