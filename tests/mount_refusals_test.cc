// The mount refuses what would hurt it or say too little (issue 24): a
// mountpoint over, inside or above its store, a .ptcfs/config naming a field
// twice or a step beyond any integer, and `ptcfs umount` says why in its own
// words. Every test unmounts, also when it fails (Mount's destructor).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "mount_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

const std::string kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";


class MountRefusalsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testing::RequireFuse(); }
  void SetUp() override {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + kDims + " --config tp=2,pp=2 " + tmp_ / "src");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + kDims + " --config tp=2,pp=2 " + tmp_ / "src " + store_);
    ASSERT_EQ(r.first, 0) << r.second;
  }
  static bool Mounted(const std::string& dir) { return Sh("mountpoint -q '" + dir + "'").first == 0; }
  TempDir tmp_;
  std::string store_ = tmp_ / "store";
};

TEST_F(MountRefusalsTest, MountOverInsideOrAboveTheStoreIsRefused) {
  fs::create_directories(store_ + "/sub");
  for (const auto& [dir, says] : {std::pair<std::string, std::string>{store_, "is the store"},
                                  {store_ + "/gen-000001", "inside the store"},
                                  {store_ + "/sub", "inside the store"},
                                  {tmp_.path(), "holds the store"}}) {
    auto r = Ptcfs("mount --nonempty " + store_ + " " + dir);
    EXPECT_EQ(r.first, 2) << dir << ": " << r.second;
    EXPECT_TRUE(Contains(r.second, "ptcfs mount: " + dir + ": " + says)) << r.second;
    EXPECT_FALSE(Mounted(dir)) << dir;
    if (Mounted(dir)) Sh("fusermount3 -u '" + dir + "'");
  }
  fs::remove(store_ + "/sub");
  // The store is not held by a lingering daemon: a writer takes it.
  auto r = Ptcfs("transform " + store_ + " --to tp=1,pp=1");
  EXPECT_EQ(r.first, 0) << r.second;
}

TEST_F(MountRefusalsTest, ConfigNamingAFieldTwiceOrBeyondRangeIsRefused) {
  Mount m(store_, tmp_ / "mnt");
  EXPECT_EQ(WriteConfig(m.dir(), R"({"config": "tp=1,pp=2", "config": "tp=2,pp=1"})"), EINVAL);
  auto s = MountStatus(m.dir());
  EXPECT_EQ(s["config"], "tp=2,pp=2,dp=1,per_worker=8") << s.dump();
  EXPECT_TRUE(Contains(s["last_error"].get<std::string>(), "the field 'config' is given twice")) << s.dump();
  EXPECT_EQ(WriteConfig(m.dir(), R"({"config": "tp=2,pp=2", "step": 18446744073709551616})"), EINVAL);
  s = MountStatus(m.dir());
  EXPECT_TRUE(Contains(s["last_error"].get<std::string>(), "'step' is out of range")) << s.dump();
  EXPECT_EQ(s["state"], "serving") << s.dump();
}

TEST_F(MountRefusalsTest, UmountSaysWhyInOneLine) {
  Mount m(store_, tmp_ / "mnt");
  const int fd = ::open((m.dir() + "/model/rank-00000/model.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto r = Ptcfs("umount " + m.dir());
  ::close(fd);
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs umount: " + m.dir() + ": busy: ")) << r.second;
  EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << r.second;
  EXPECT_TRUE(Mounted(m.dir()));

  r = Ptcfs("umount " + tmp_ / "src");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_EQ(r.second, "ptcfs umount: " + tmp_ / "src" + ": not a mount point\n");
  r = Ptcfs("umount \"" + tmp_ / "it's; touch pwned" + "\"");
  EXPECT_NE(r.first, 0) << r.second;
  EXPECT_FALSE(fs::exists("pwned"));
}

}  // namespace
}  // namespace ptc
