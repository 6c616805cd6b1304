// One writer per store (ptc/store/store_lock.h): the lock between processes,
// the write path that requires it, and generation numbers that never go back.
#include "ptc/store/store_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=2,hidden=16,heads=2,vocab=64,seq=8";

// A child process that takes the lock of `root` (as `holder`), writes one byte
// to `ready` and holds it until `release` is closed (or it is killed).
struct Holder {
  pid_t pid = -1;
  int release = -1;

  Holder(const std::string& root, const std::string& holder) {
    int ready[2], rel[2];
    // O_CLOEXEC: a `ptcfs` run by the test must not keep the release pipe open.
    EXPECT_EQ(pipe2(ready, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(rel, O_CLOEXEC), 0);
    pid = fork();
    if (pid == 0) {
      close(ready[0]);
      close(rel[1]);
      StoreLockOptions o;
      o.holder = holder;
      Result<StoreLock> lock = StoreLock::Acquire(root, o);
      const char c = lock.ok() ? 'y' : 'n';
      (void)!write(ready[1], &c, 1);
      char buf;
      (void)!read(rel[0], &buf, 1);  // returns when the parent closes its end
      _exit(0);
    }
    close(ready[1]);
    close(rel[0]);
    release = rel[1];
    char c = 0;
    EXPECT_EQ(read(ready[0], &c, 1), 1);
    EXPECT_EQ(c, 'y') << "the child could not take the lock";
    close(ready[0]);
  }
  void Release() {
    if (release >= 0) close(release);
    release = -1;
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Holder() { Release(); }
};

class StoreLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_ / "store";
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt" +
              " " + root_);
    ASSERT_EQ(r.first, 0) << r.second;
  }
  TempDir tmp_;
  std::string root_;
};

TEST_F(StoreLockTest, SecondProcessIsRefusedWithTheHolderNamed) {
  Holder holder(root_, "ptcfs mount STORE /mnt/x");
  Result<StoreLock> lock = StoreLock::Acquire(root_);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), Code::kFailedPrecondition);
  const std::string& m = lock.status().message();
  EXPECT_NE(m.find(root_ + ": locked by pid " + std::to_string(holder.pid)), std::string::npos) << m;
  EXPECT_NE(m.find("ptcfs mount STORE /mnt/x"), std::string::npos) << m;
  EXPECT_NE(m.find("since "), std::string::npos) << m;
  EXPECT_FALSE(StoreLock::HeldByThisProcess(root_));
  holder.Release();
  lock = StoreLock::Acquire(root_);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  EXPECT_TRUE(StoreLock::HeldByThisProcess(root_));
  EXPECT_NE(StoreLock::ReadHolder(root_).value().find("pid " + std::to_string(getpid())), std::string::npos);
  *lock = StoreLock();
  EXPECT_FALSE(StoreLock::HeldByThisProcess(root_));
  EXPECT_EQ(StoreLock::ReadHolder(root_).value(), "");  // cleared on release
}

TEST_F(StoreLockTest, KilledHolderLetsGo) {
  Holder holder(root_, "doomed");
  kill(holder.pid, SIGKILL);
  holder.Release();
  Result<StoreLock> lock = StoreLock::Acquire(root_);
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
}

TEST_F(StoreLockTest, WaitBlocksUntilTheHolderLetsGo) {
  Holder holder(root_, "slow writer");
  const auto start = std::chrono::steady_clock::now();
  // The holder lets go when this process closes its pipe end: do it from a thread after 300 ms.
  std::thread t([&] {
    usleep(300 * 1000);
    close(holder.release);
    holder.release = -1;
  });
  StoreLockOptions o;
  o.wait = true;
  Result<StoreLock> lock = StoreLock::Acquire(root_, o);
  t.join();
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
}

TEST_F(StoreLockTest, WritePathRequiresTheLock) {
  auto store = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(store.ok());
  {
    Holder holder(root_, "ptcfs transform");
    const auto before = Snapshot(root_);
    auto w = (*store)->BeginGeneration();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(w.status().message().find("locked by pid " + std::to_string(holder.pid)), std::string::npos)
        << w.status().message();
    Status gc = (*store)->CollectGarbage();
    EXPECT_NE(gc.message().find("locked by pid"), std::string::npos) << gc.ToString();
    auto w2 = Store::OpenForWrite(Env::Default(), root_, {});
    EXPECT_EQ(w2.status().code(), Code::kFailedPrecondition);
    EXPECT_TRUE(Snapshot(root_) == before) << "the store changed";
  }
  // Free again: the same Store writes (taking the lock for that one writer only).
  auto w = (*store)->BeginGeneration();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(StoreLock::HeldByThisProcess(root_));
  w->reset();
  EXPECT_FALSE(StoreLock::HeldByThisProcess(root_));
  // OpenForWrite holds it for the Store's life.
  auto locked = Store::OpenForWrite(Env::Default(), root_, {});
  ASSERT_TRUE(locked.ok()) << locked.status().ToString();
  EXPECT_TRUE(StoreLock::HeldByThisProcess(root_));
  auto r = Ptcfs("transform " + root_ + " --to tp=1,pp=1");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find("locked by pid " + std::to_string(getpid())), std::string::npos) << r.second;
  EXPECT_NE(r.second.find("--wait"), std::string::npos) << r.second;
  locked->reset();
  EXPECT_FALSE(StoreLock::HeldByThisProcess(root_));
}

TEST_F(StoreLockTest, StaleStoreCannotBuildOnAnOldManifest) {
  auto store = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(store.ok());
  auto r = Ptcfs("transform " + root_ + " --to tp=1,pp=1 --keep-old");  // another writer commits generation 2
  ASSERT_EQ(r.first, 0) << r.second;
  auto w = (*store)->BeginGeneration();
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("names generation 2"), std::string::npos) << w.status().message();
  EXPECT_FALSE((*store)->CollectGarbage().ok());
  EXPECT_TRUE(fs::exists(root_ + "/gen-000002/manifest.json"));
  EXPECT_EQ(Store::Open(Env::Default(), root_).value()->current_generation(), 2u);
}

TEST_F(StoreLockTest, GenerationNumbersNeverGoBack) {
  auto r = Ptcfs("transform " + root_ + " --to tp=1,pp=1 --keep-old");
  ASSERT_EQ(r.first, 0) << r.second;
  // The root manifest set back by hand to generation 1; a committed-looking
  // generation 7 and a leftover 9 (no manifest) above it.
  Spit(root_ + "/manifest.json", R"({"format":"ptcfs-store","version":1,"generation":1})");
  fs::create_directories(root_ + "/gen-000007");
  fs::copy_file(root_ + "/gen-000002/manifest.json", root_ + "/gen-000007/manifest.json");
  fs::create_directories(root_ + "/gen-000009/worker-00");
  auto store = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(store.ok());
  ASSERT_EQ((*store)->current_generation(), 1u);
  const std::string gen2 = Slurp(root_ + "/gen-000002/manifest.json");
  ASSERT_TRUE((*store)->CollectGarbage().ok());
  auto w = (*store)->BeginGeneration();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->generation(), 8u);                // above every gen-* directory that holds a manifest
  EXPECT_FALSE(fs::exists(root_ + "/gen-000009"));  // a dead writer's leftover
  w->reset();
  EXPECT_EQ(Slurp(root_ + "/gen-000002/manifest.json"), gen2);
  EXPECT_TRUE(fs::exists(root_ + "/gen-000007/manifest.json"));
  // The CLI: import builds above them too, and leaves them alone.
  r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt" + " " +
            root_);
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("generation 8"), std::string::npos) << r.second;
  EXPECT_EQ(Slurp(root_ + "/gen-000002/manifest.json"), gen2);
  EXPECT_TRUE(fs::exists(root_ + "/gen-000007/manifest.json"));
  r = Ptcfs("verify " + root_);
  EXPECT_EQ(r.first, 0) << r.second;
}

TEST_F(StoreLockTest, CreateAcceptsADirectoryHoldingOnlyTheLock) {
  const std::string root = tmp_ / "fresh";
  auto lock = StoreLock::Acquire(root, {.holder = "", .wait = false, .create_dir = true});
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  auto store = Store::Create(Env::Default(), root);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(StoreLock::Acquire(tmp_ / "missing").status().code(), Code::kNotFound);
}

TEST_F(StoreLockTest, WaitingCommandsRunAfterTheHolder) {
  Holder holder(root_, "ptcfs mount STORE /mnt/m");
  const auto before = Snapshot(root_);
  for (const std::string& cmd :
       {"transform " + root_ + " --to tp=1,pp=1", "import --schema megatron-gpt --dims " + std::string(kDims) +
                                                      " --config tp=2,pp=1 " + tmp_ / "ckpt" + " " + root_}) {
    auto r = Ptcfs(cmd);
    EXPECT_EQ(r.first, 1) << cmd << "\n" << r.second;
    EXPECT_NE(r.second.find("locked by pid " + std::to_string(holder.pid) + " (ptcfs mount STORE /mnt/m"),
              std::string::npos)
        << r.second;
  }
  EXPECT_TRUE(Snapshot(root_) == before) << "the store changed";
  std::thread t([&] {
    usleep(500 * 1000);
    holder.Release();
  });
  auto r = Ptcfs("transform " + root_ + " --to tp=1,pp=1 --wait");
  t.join();
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("waiting"), std::string::npos) << r.second;
  EXPECT_EQ(Store::Open(Env::Default(), root_).value()->current_generation(), 2u);
}

}  // namespace
}  // namespace ptc
