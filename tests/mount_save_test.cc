// Saves through a real mount, by the kernel and by the daemon (issue 42,
// docs/design.md "A save on a cluster mount"): with passthrough on, a file a
// job creates in megatron/iter_N/ is written by the kernel into its staged
// file; with --passthrough off every byte goes through the daemon. Either way
// the bytes torch.save wrote land in the store unchanged (compared with the
// same torch.save to a local directory), truncates, O_TRUNC reopens, rewrites,
// partial writes, a second open and (through the kernel) a shared mapping
// commit exactly what was written, a file still open for writing through the
// kernel holds the save back (EBUSY, named) until it is closed, and a daemon
// killed -9 before the latest file leaves the old generation; a daemon that
// is not root writes the save itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "mount_util.h"
#include "ptc/store/store_lock.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

const std::string kModel = "--schema megatron-gpt --dims layers=4,hidden=32,heads=4,vocab=128,seq=16";
const std::vector<std::string> kRanks = {"mp_rank_00", "mp_rank_01"};  // tp=2, pp=1

std::string Client(const std::string& script) {
  return "/usr/bin/python3 " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/" + script + " ";
}

class MountSaveTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { RequireFuse(); }
  void SetUp() override {
    auto [code, out] = Sh(Client("megatron_ckpt.py") + "make " + tmp_ / "src" + " --tp 2 --pp 1 --args --optimizer");
    ASSERT_EQ(code, 0) << out;
    auto [c2, o2] = Ptcfs("import --format megatron " + kModel + " " + tmp_ / "src " + tmp_ / "store");
    ASSERT_EQ(c2, 0) << o2;
  }
  bool kernel() const { return GetParam() == "auto"; }
  std::string MountFlags() const { return "--format megatron --passthrough " + GetParam(); }
  // The mount's passthrough is what the parameter asks for (fails under CI when it cannot be on).
  void RequireMode(const std::string& mnt) {
    const nlohmann::json pt = MountStatus(mnt)["passthrough"];
    if (!kernel()) {
      ASSERT_EQ(pt["state"], "off: --passthrough off") << pt.dump();
      return;
    }
    if (pt["state"] == "on") return;
    std::printf("%s: passthrough is %s\n", InCi() ? "FAIL" : "SKIP", pt["state"].dump().c_str());
    if (InCi()) FAIL() << pt.dump();
    GTEST_SKIP();
  }
  // Opens of a save's files were answered as the parameter says: all by the kernel, or all by the daemon.
  void ExpectSaveOpensBy(const std::string& mnt) {
    const nlohmann::json opens = MountStatus(mnt)["passthrough"]["save_opens"];
    EXPECT_GT(opens[kernel() ? "kernel" : "daemon"].get<int>(), 0) << opens.dump();
    EXPECT_EQ(opens[kernel() ? "daemon" : "kernel"], 0) << opens.dump();
  }
  // torch.saves of the next iteration into the mount and into MIRROR (the reference); no latest file.
  void SaveWithoutLatest(const std::string& mnt, int iteration) {
    auto [code, out] = Sh(Client("megatron_ckpt.py") + "save " + mnt + "/megatron " + tmp_ / "mirror" +
                          " --no-latest --iteration " + std::to_string(iteration));
    ASSERT_EQ(code, 0) << out;
  }
  // Writes the latest file; returns the errno of its close (0: committed).
  static int WriteLatest(const std::string& mnt, int iteration) {
    const int fd = open((mnt + "/megatron/latest_checkpointed_iteration.txt").c_str(), O_WRONLY | O_TRUNC);
    if (fd < 0) return errno;
    const std::string text = std::to_string(iteration);
    if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return errno;
    return close(fd) == 0 ? 0 : errno;
  }
  // The committed generation's rank files: the staged files linked into the
  // store; each equals MIRROR's torch.save of the same state byte for byte.
  void ExpectStoredEqualMirror(int iteration) {
    const auto gen = nlohmann::json::parse(Slurp(tmp_ / "store/manifest.json"))["generation"].get<int>();
    char dir[32];
    std::snprintf(dir, sizeof(dir), "store/gen-%06d/worker-00", gen);
    char iter[16];
    std::snprintf(iter, sizeof(iter), "iter_%07d", iteration);
    for (const std::string& rank : kRanks) {
      const std::string mirror = tmp_ / ("mirror/" + std::string(iter) + "/" + rank + "/model_optim_rng.pt");
      auto [c, o] = Sh("cmp " + tmp_ / (std::string(dir) + "/" + rank + ".model_optim_rng.pt") + " " + mirror);
      EXPECT_EQ(c, 0) << o;
    }
  }
  // Every tensor the mount shows equals the reference's (tests/clients/megatron_ckpt.py check).
  void Check(const std::string& reference, const std::string& mnt) {
    auto [c, o] = Sh(Client("megatron_ckpt.py") + "check " + reference + " 2 1 " + mnt + "/megatron 2 1");
    EXPECT_EQ(c, 0) << o;
    EXPECT_NE(o.find("CHECK OK"), std::string::npos) << o;
  }
  TempDir tmp_;
};

// A job's torch.save through the mount (Megatron's layout), then the latest
// file: the staged files are the job's bytes before the commit (read through
// the mount and on disk) and the store's after it, equal to the same
// torch.save to a local directory; the mount reads them back tensor for tensor.
TEST_P(MountSaveTest, TheBytesAJobWritesLandInTheStoreUnchanged) {
  Mount m(tmp_ / "store", tmp_ / "mnt", MountFlags());
  ASSERT_NO_FATAL_FAILURE(RequireMode(m.dir()));
  ASSERT_NO_FATAL_FAILURE(SaveWithoutLatest(m.dir(), 200));
  for (const std::string& rank : kRanks) {
    const std::string file = "iter_0000200/" + rank + "/model_optim_rng.pt";
    auto [c1, o1] = Sh("cmp " + m.dir() + "/megatron/" + file + " " + tmp_ / ("mirror/" + file));
    EXPECT_EQ(c1, 0) << o1;
    auto [c2, o2] = Sh("cmp " + tmp_ / ("store/ingest/" + file) + " " + tmp_ / ("mirror/" + file));
    EXPECT_EQ(c2, 0) << o2;
  }
  ExpectSaveOpensBy(m.dir());
  ASSERT_EQ(WriteLatest(m.dir(), 200), 0) << MountStatus(m.dir()).dump();
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 2) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  EXPECT_EQ(status["passthrough"]["open_backing_files"], 0) << status.dump();
  ExpectStoredEqualMirror(200);
  Check(tmp_ / "mirror", m.dir());
  EXPECT_FALSE(fs::exists(tmp_ / "store/ingest/iter_0000200"));
  auto [cv, ov] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(cv, 0) << ov;
}

// Each rank file made by tests/clients/save_writes.py: junk, truncates, an
// O_TRUNC reopen, pieces written from the end, a tail cut off, a second open
// and (by the kernel) a shared mapping; what commits is exactly the job's file.
TEST_P(MountSaveTest, TruncatesRewritesAndPartialWritesCommitExactlyWhatWasWritten) {
  Mount m(tmp_ / "store", tmp_ / "mnt", MountFlags());
  ASSERT_NO_FATAL_FAILURE(RequireMode(m.dir()));
  ASSERT_NO_FATAL_FAILURE(SaveWithoutLatest(m.dir(), 300));
  for (const std::string& rank : kRanks) {
    const std::string file = "/megatron/iter_0000300/" + rank + "/model_optim_rng.pt";
    ASSERT_EQ(unlink((m.dir() + file).c_str()), 0) << file << ": " << std::strerror(errno);
    auto [c, o] = Sh(Client("save_writes.py") + tmp_ / ("mirror" + file.substr(9)) + " " + m.dir() + file +
                     (kernel() ? " --mmap" : ""));
    ASSERT_EQ(c, 0) << o;
    EXPECT_NE(o.find("WRITES OK"), std::string::npos) << o;
  }
  ExpectSaveOpensBy(m.dir());
  ASSERT_EQ(WriteLatest(m.dir(), 300), 0) << MountStatus(m.dir()).dump();
  EXPECT_EQ(MountStatus(m.dir())["generation"], 2);
  ExpectStoredEqualMirror(300);
  Check(tmp_ / "mirror", m.dir());
}

// A rank file still open for writing when the latest file comes: through the
// kernel nothing could stop its writes after the commit, so the save is held
// back (the latest file's close fails with EBUSY, the file named) and taken
// once the file is closed. Through the daemon the save is taken and a later
// write through the open file fails (the daemon's seal).
TEST_P(MountSaveTest, AFileStillOpenForWritingHoldsTheSaveBack) {
  Mount m(tmp_ / "store", tmp_ / "mnt", MountFlags());
  ASSERT_NO_FATAL_FAILURE(RequireMode(m.dir()));
  ASSERT_NO_FATAL_FAILURE(SaveWithoutLatest(m.dir(), 400));
  const std::string file = m.dir() + "/megatron/iter_0000400/mp_rank_01/model_optim_rng.pt";
  const int fd = open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  if (kernel()) {
    EXPECT_EQ(WriteLatest(m.dir(), 400), EBUSY);
    auto status = MountStatus(m.dir());
    EXPECT_EQ(status["generation"], 1) << status.dump();
    ASSERT_TRUE(status["last_error"].is_string()) << status.dump();
    EXPECT_NE(status["last_error"].get<std::string>().find(
                  "iter_0000400/mp_rank_01/model_optim_rng.pt: still open for writing (the kernel writes it)"),
              std::string::npos)
        << status.dump();
    EXPECT_TRUE(fs::exists(tmp_ / "store/ingest/iter_0000400/mp_rank_01/model_optim_rng.pt"));  // kept to retry
    ASSERT_EQ(close(fd), 0);
  } else {
    EXPECT_EQ(WriteLatest(m.dir(), 400), 0) << MountStatus(m.dir()).dump();
    EXPECT_EQ(write(fd, "x", 1), -1);  // its save was taken
    EXPECT_EQ(errno, EACCES);
    close(fd);
  }
  if (kernel()) {
    ASSERT_EQ(WriteLatest(m.dir(), 400), 0) << MountStatus(m.dir()).dump();
  }
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["generation"], 2) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
  ExpectStoredEqualMirror(400);
}

// The daemon killed -9 after every rank file was written, before the latest
// file: mounted again, the store serves the old generation (its tensors the
// source's), verifies, and the save done again commits.
TEST_P(MountSaveTest, ACrashBeforeTheLatestFileLeavesTheOldGeneration) {
  const std::string mnt = tmp_ / "mnt";
  {
    Mount m(tmp_ / "store", mnt, MountFlags());
    ASSERT_NO_FATAL_FAILURE(RequireMode(mnt));
    ASSERT_NO_FATAL_FAILURE(SaveWithoutLatest(mnt, 500));
    const Result<std::string> holder = StoreLock::ReadHolder(tmp_ / "store");
    ASSERT_TRUE(holder.ok() && holder->starts_with("pid ")) << holder.status().ToString();
    ASSERT_EQ(kill(std::stoi(holder->substr(4)), SIGKILL), 0);  // the daemon this test started
    bool free = false;
    for (int i = 0; i < 100 && !free; ++i) {
      free = StoreLock::Acquire(tmp_ / "store").ok();
      if (!free) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(free) << "the killed daemon still holds the store";
    Sh("umount -l " + mnt);  // the dead mount; Mount's umount then finds nothing
  }
  auto [cv, ov] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(cv, 0) << ov;
  Mount m(tmp_ / "store", mnt, MountFlags());
  auto status = MountStatus(mnt);
  EXPECT_EQ(status["generation"], 1) << status.dump();
  EXPECT_EQ(Slurp(mnt + "/megatron/latest_checkpointed_iteration.txt"), "100");
  Check(tmp_ / "src", mnt);
  fs::remove_all(tmp_ / "mirror");
  auto [code, out] = Sh(Client("megatron_ckpt.py") + "save " + mnt + "/megatron " + tmp_ / "mirror --iteration 500");
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(MountStatus(mnt)["generation"], 2);
  ExpectStoredEqualMirror(500);
  Check(tmp_ / "mirror", mnt);
}

// A daemon that is not root cannot register backing files (CAP_SYS_ADMIN):
// with --passthrough auto as with off it writes the save's bytes itself, and
// the save commits as the job wrote it.
TEST_P(MountSaveTest, ANonRootDaemonWritesTheSaveItself) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  struct stat dev;
  ASSERT_EQ(stat("/dev/fuse", &dev), 0);
  ASSERT_EQ(chmod("/dev/fuse", 0666), 0);  // the daemon runs as nobody (through fusermount3)
  struct Restore {
    mode_t mode;
    ~Restore() { chmod("/dev/fuse", mode); }
  } restore{dev.st_mode & 07777};
  fs::create_directories(tmp_ / "mnt");
  fs::create_directories(tmp_ / "mirror");
  ASSERT_EQ(Sh("chmod 755 " + tmp_.path() + " && chown -R 65534:65534 " + tmp_ / "store " + tmp_ / "mnt " +
               tmp_ / "mirror")
                .first,
            0);
  const std::string nobody = AsNobody(tmp_.path());
  auto [code, out] = Sh(nobody + PTCFS_BINARY + " mount " + MountFlags() + " " + tmp_ / "store " + tmp_ / "mnt");
  ASSERT_EQ(code, 0) << out;
  struct Unmount {
    std::string dir;
    ~Unmount() { Sh("fusermount3 -u " + dir); }
  } unmount{tmp_ / "mnt"};
  const std::string mnt = tmp_ / "mnt";
  // The client from a copy nobody can read: the checkout may sit under a directory only root may
  // enter (a clone in /root, or bench/newcomer.sh's mktemp -d).
  const std::string script = tmp_ / "megatron_ckpt.py";
  fs::copy_file(std::string(PTCFS_SOURCE_DIR) + "/tests/clients/megatron_ckpt.py", script);
  fs::permissions(script, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  auto [sc, sout] = Sh(nobody + "env HOME=/tmp /usr/bin/python3 " + script + " save " + mnt + "/megatron " +
                       tmp_ / "mirror --iteration 600");
  ASSERT_EQ(sc, 0) << sout;
  auto [c, text] = Sh(nobody + "cat " + mnt + "/.ptcfs/status");
  ASSERT_EQ(c, 0) << text;
  const nlohmann::json status = nlohmann::json::parse(text);
  EXPECT_EQ(status["passthrough"]["state"], kernel() ? "off: registering backing files needs CAP_SYS_ADMIN (the "
                                                       "daemon is not root)"
                                                     : "off: --passthrough off")
      << text;
  EXPECT_GT(status["passthrough"]["save_opens"]["daemon"].get<int>(), 0) << text;
  EXPECT_EQ(status["passthrough"]["save_opens"]["kernel"], 0) << text;
  EXPECT_EQ(status["generation"], 2) << text;
  ExpectStoredEqualMirror(600);
}

INSTANTIATE_TEST_SUITE_P(KernelAndDaemon, MountSaveTest, ::testing::Values("auto", "off"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param == "auto" ? std::string("Kernel") : std::string("Daemon");
                         });

}  // namespace
}  // namespace ptc
