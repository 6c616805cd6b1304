// Issue 12 (items 1 and 8) end to end: a mount daemon holds its store's writer
// lock for its whole life; every writing command and a second mount are
// refused naming it and leave the store byte-identical; --wait waits; the
// mountpoint is checked before anything is mounted. Needs root and /dev/fuse.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "mount_util.h"
#include "ptc/store/store.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h and mount_util.h

constexpr const char* kDims = "layers=2,hidden=16,heads=2,vocab=64,seq=8";

class WriterLockCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RequireFuse(); }
  void SetUp() override {
    store_ = tmp_ / "store";
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) +
                   " --config tp=2,pp=1 --optimizer adam " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs(ImportArgs());
    ASSERT_EQ(r.first, 0) << r.second;
  }
  std::string ImportArgs() const {
    return "import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt" + " " +
           store_;
  }
  TempDir tmp_;
  std::string store_;
};

TEST_F(WriterLockCliTest, MountedStoreRefusesOtherWriters) {
  Mount m(store_, tmp_ / "m");
  const auto before = Snapshot(store_);
  const std::string optim = m.dir() + "/model/rank-00001/optim.safetensors";
  const std::string served = Slurp(optim);
  for (const std::string& cmd : {"transform " + store_ + " --to tp=1,pp=1", ImportArgs(),
                                 "data advance " + store_ + " --step 1", "mount " + store_ + " " + tmp_ / "m2"}) {
    fs::create_directories(tmp_ / "m2");
    auto r = Ptcfs(cmd);
    EXPECT_EQ(r.first, 1) << cmd << "\n" << r.second;
    EXPECT_NE(r.second.find(store_ + ": locked by pid "), std::string::npos) << cmd << "\n" << r.second;
    EXPECT_NE(r.second.find("mount " + store_ + " " + m.dir()), std::string::npos) << r.second;  // the holder
  }
  EXPECT_FALSE(fs::exists(tmp_ / "m2/.ptcfs")) << "the second mount mounted";
  EXPECT_TRUE(Snapshot(store_) == before) << "the store changed";
  // The daemon, not the process that started it, is named.
  const std::string holder = StoreLock::ReadHolder(store_).value();
  const pid_t pid = std::stoi(holder.substr(4));
  EXPECT_EQ(kill(pid, 0), 0) << holder;
  // Still served, and the mount's own rewrite works on the generation it serves.
  EXPECT_EQ(Slurp(optim), served);
  ASSERT_EQ(WriteConfig(m.dir(), "tp=1,pp=1"), 0);
  WaitServing(m.dir());
  EXPECT_EQ(MountStatus(m.dir())["generation"], 2);
  auto r = Ptcfs("verify " + store_);
  EXPECT_EQ(r.first, 0) << r.second;
}

TEST_F(WriterLockCliTest, WaitRunsOnceTheMountIsGone) {
  const std::string dir = tmp_ / "m";
  fs::create_directories(dir);
  auto r = Ptcfs("mount " + store_ + " " + dir);
  ASSERT_EQ(r.first, 0) << r.second;
  std::thread t([&] {
    usleep(700 * 1000);
    Sh("fusermount3 -u " + dir);
  });
  r = Ptcfs("transform " + store_ + " --to tp=1,pp=1 --wait");
  t.join();
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("waiting"), std::string::npos) << r.second;
  EXPECT_EQ(Store::Open(Env::Default(), store_).value()->current_generation(), 2u);
}

TEST_F(WriterLockCliTest, MountpointIsChecked) {
  const std::string full = tmp_ / "full";
  fs::create_directories(full);
  Spit(full + "/x", "x");
  auto r = Ptcfs("mount " + store_ + " " + full);
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find(full + ": directory is not empty"), std::string::npos) << r.second;
  Spit(tmp_ / "file", "x");
  r = Ptcfs("mount " + store_ + " " + tmp_ / "file");
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find(tmp_ / "file" + ": not a directory"), std::string::npos) << r.second;
  r = Ptcfs("mount " + store_ + " " + tmp_ / "absent");
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find(tmp_ / "absent"), std::string::npos) << r.second;
  EXPECT_EQ(StoreLock::ReadHolder(store_).value(), "") << "a refused mount took the lock";
  {
    Mount m(store_, tmp_ / "m");
    r = Ptcfs("mount " + store_ + " " + m.dir());
    EXPECT_EQ(r.first, 1) << r.second;
    EXPECT_NE(r.second.find(m.dir() + ": already a mount point"), std::string::npos) << r.second;
  }
  for (int i = 0; i < 100 && !StoreLock::ReadHolder(store_).value().empty(); ++i) {
    usleep(50 * 1000);  // the daemon exits (and lets go) shortly after the unmount
  }
  {
    Mount m(store_, full, "--nonempty");
    EXPECT_TRUE(fs::exists(full + "/.ptcfs/status"));
  }
}

// mount --wait waits like the other writers: while another process holds the
// lock it says whom it waits for and mounts nothing; once the lock is free it
// mounts and its daemon holds the lock.
TEST_F(WriterLockCliTest, MountWaitMountsOnceTheHolderIsGone) {
  const std::string first = tmp_ / "m", second = tmp_ / "m2";
  fs::create_directories(first);
  fs::create_directories(second);
  auto r = Ptcfs("mount " + store_ + " " + first);
  ASSERT_EQ(r.first, 0) << r.second;
  struct Unmount {
    std::string dir;
    ~Unmount() { Sh("fusermount3 -u " + dir); }
  } unmount_second{second};
  std::atomic<bool> mounted_early{false};
  std::thread t([&] {
    usleep(700 * 1000);
    mounted_early = Sh("mountpoint -q " + second).first == 0;
    Sh("fusermount3 -u " + first);
  });
  r = Ptcfs("mount --wait " + store_ + " " + second);
  t.join();
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find(store_ + ": locked by pid "), std::string::npos) << r.second;
  EXPECT_NE(r.second.find("mount " + store_ + " " + first), std::string::npos) << r.second;  // whom it waited for
  EXPECT_NE(r.second.find("; waiting"), std::string::npos) << r.second;
  EXPECT_FALSE(mounted_early) << "mounted while the store was locked";
  EXPECT_TRUE(fs::exists(second + "/.ptcfs/status"));
  EXPECT_NE(StoreLock::ReadHolder(store_).value().find(store_ + " " + second), std::string::npos);
}

}  // namespace
}  // namespace ptc
