// The mount against hostile and odd inputs (issues 12 and 24): bytes that are not
// UTF-8, huge, empty and oversized configs, missing shard files, chmod, file times,
// the removal of a generation whose last reader closes, and a shard that is a
// FIFO. No input may end the daemon, or keep it alive after umount. Every test
// unmounts, also when it fails (Mount's destructor).
#include <fcntl.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "mount_util.h"
#include "ptc/store/store_lock.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

const std::string kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";

class MountHostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testing::RequireFuse(); }
  // A store of `config` at `store`.
  void MakeStore(const std::string& config, const std::string& store) {
    auto [code, out] = Ptcfs("synth --schema megatron-gpt --dims " + kDims +
                             " --optimizer adam --dtype bf16 --config " + config + " " + tmp_ / "src");
    ASSERT_EQ(code, 0) << out;
    std::tie(code, out) = Ptcfs("import --schema megatron-gpt --dims " + kDims + " --config " + config + " " +
                                tmp_ / "src '" + store + "'");
    ASSERT_EQ(code, 0) << out;
  }
  // The daemon still answers: the status parses, the mount is there.
  static void ExpectAlive(const std::string& mnt) {
    EXPECT_EQ(Sh("mountpoint -q '" + mnt + "'").first, 0) << "the daemon ended";
    nlohmann::json s;
    ASSERT_NO_THROW(s = MountStatus(mnt)) << "status unreadable";
    EXPECT_EQ(s["state"], "serving") << s.dump();
  }
  // The shard files (relative to the store) holding `tensor` in generation 1.
  std::set<std::string> ShardFiles(const std::string& store, const std::string& tensor) {
    std::set<std::string> files;
    const auto manifest = nlohmann::json::parse(Slurp(store + "/gen-000001/manifest.json"));
    for (const auto& s : manifest["shards"]) {
      if (s["tensor"] == tensor) files.insert(s["file"].get<std::string>());
    }
    return files;
  }
  TempDir tmp_;
};

TEST_F(MountHostileTest, InvalidUtf8NeverEndsTheDaemon) {
  // A store whose path is not UTF-8, so that errors naming it are not either.
  const std::string store = tmp_ / "store\xff";
  MakeStore("tp=2,pp=1", store);
  Mount m(store, tmp_ / "mnt");
  EXPECT_EQ(WriteConfig(m.dir(), "tp=\xff"), EINVAL);
  ExpectAlive(m.dir());
  const std::string error = MountStatus(m.dir())["last_error"].get<std::string>();
  EXPECT_NE(error.find("\xef\xbf\xbd"), std::string::npos) << error;  // U+FFFD for the bad byte
  EXPECT_EQ(WriteConfig(m.dir(), "{\"config\": \"tp=2\xff\"}"), EINVAL);
  ExpectAlive(m.dir());
  auto [c, o] = Ptcfs("reconfigure " + m.dir() + " --to \"$(printf 'tp=2\\377')\"");
  EXPECT_NE(c, 0) << o;
  ExpectAlive(m.dir());
  // An error that names the store path.
  const std::string tensor = "language_model.encoder.layers.0.self_attention.dense.weight";
  for (const std::string& f : ShardFiles(store, tensor)) fs::remove(store + "/" + f);
  std::tie(c, o) = Sh("cat " + m.dir() + "/model/rank-00000/model.safetensors >/dev/null");
  EXPECT_NE(c, 0);
  ExpectAlive(m.dir());
  EXPECT_EQ(MountStatus(m.dir())["config"], "tp=2,pp=1,dp=1,per_worker=8");
}

TEST_F(MountHostileTest, LastErrorIsCappedAndClearedByCommit) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  EXPECT_EQ(WriteConfig(m.dir(), "tp=" + std::string(1 << 20, 'x')), EINVAL);
  ExpectAlive(m.dir());
  const std::string error = MountStatus(m.dir())["last_error"].get<std::string>();
  EXPECT_LE(error.size(), 4096u + 64u);
  EXPECT_NE(error.find(" bytes cut)"), std::string::npos) << error.substr(0, 200);
  ASSERT_EQ(WriteConfig(m.dir(), "tp=4"), 0);
  WaitServing(m.dir());
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
}

TEST_F(MountHostileTest, EmptyConfigIsRejected) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  const auto before = Snapshot(tmp_ / "store");
  {
    Mount m(tmp_ / "store", tmp_ / "mnt");
    for (const char* text : {"\n", "", "  \t \n"}) {
      EXPECT_EQ(WriteConfig(m.dir(), text), std::string(text).empty() ? 0 : EINVAL) << "'" << text << "'";
    }
    const std::string error = MountStatus(m.dir())["last_error"].get<std::string>();
    EXPECT_NE(error.find("empty config"), std::string::npos) << error;
    EXPECT_NE(error.find(".ptcfs/config"), std::string::npos) << error;
    auto [c, o] = Ptcfs("reconfigure " + m.dir() + " --to ''");
    EXPECT_NE(c, 0);
    EXPECT_NE(o.find("empty config"), std::string::npos) << o;
    ExpectAlive(m.dir());
    EXPECT_EQ(MountStatus(m.dir())["config"], "tp=2,pp=1,dp=1,per_worker=8");
    EXPECT_EQ(MountStatus(m.dir())["generation"], 1);
  }
  auto [c, o] = Ptcfs("transform --to '' " + tmp_ / "store");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find("empty config"), std::string::npos) << o;
  std::tie(c, o) = Ptcfs("export --config ' ' " + tmp_ / "store " + tmp_ / "out");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find("empty config"), std::string::npos) << o;
  EXPECT_FALSE(fs::exists(tmp_ / "store/gen-000002"));
  EXPECT_TRUE(before == Snapshot(tmp_ / "store")) << "the store changed";
}

// Issue 24 item 3: a config that passes the parser's syntax but asks for a
// million ranks (or more local tensors than a layout may hold) once grew the
// daemon until the OOM killer ended it. Now it is refused before anything is
// built for it, and the mount serves the same bytes.
TEST_F(MountHostileTest, ConfigsBeyondTheLimitsAreRefusedAndTheMountServesOn) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  const auto stored = Snapshot(tmp_ / "store");  // with the daemon's lock
  const auto served = Snapshot(m.dir() + "/model");
  ASSERT_FALSE(served.empty());
  struct Case {
    std::string config, limit;
  };
  for (const Case& k : {Case{"tp=1,pp=1,dp=1048576", "1048576 ranks exceeds the limit of 65536 ranks"},
                        Case{"tp=1,pp=1,dp=32768", "exceeds the limit of 524288 local tensors in a layout"}}) {
    auto [c, o] = Ptcfs("reconfigure " + m.dir() + " --to " + k.config);
    EXPECT_EQ(c, 2) << o;
    EXPECT_NE(o.find(k.limit), std::string::npos) << o;
    ExpectAlive(m.dir());
    EXPECT_NE(MountStatus(m.dir())["last_error"].get<std::string>().find(k.limit), std::string::npos);
    EXPECT_EQ(WriteConfig(m.dir(), k.config), EINVAL);
    ExpectAlive(m.dir());
    EXPECT_EQ(MountStatus(m.dir())["config"], "tp=2,pp=1,dp=1,per_worker=8");
    EXPECT_EQ(MountStatus(m.dir())["generation"], 1);
  }
  EXPECT_TRUE(served == Snapshot(m.dir() + "/model")) << "the mount serves other bytes";
  EXPECT_TRUE(stored == Snapshot(tmp_ / "store")) << "the store changed";
  // A config within the limits is still taken.
  ASSERT_EQ(WriteConfig(m.dir(), "tp=2,pp=1,dp=2"), 0);
  WaitServing(m.dir());
  EXPECT_EQ(Slurp(m.dir() + "/model/rank-00002/model.safetensors").size(),
            Slurp(m.dir() + "/model/rank-00000/model.safetensors").size());
}

TEST_F(MountHostileTest, MissingShardFailsWithEio) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  const std::string file = m.dir() + "/model/rank-00000/model.safetensors";
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  const std::string tensor = "language_model.encoder.layers.0.self_attention.dense.weight";
  const auto shards = ShardFiles(tmp_ / "store", tensor);
  ASSERT_FALSE(shards.empty());
  for (const std::string& f : shards) fs::remove(tmp_ / ("store/" + f));
  auto [c, o] = Sh("cat " + file + " >/dev/null");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find("Input/output error"), std::string::npos) << o;
  const std::string error = MountStatus(m.dir())["last_error"].get<std::string>();
  bool named = false;
  for (const std::string& f : shards) named |= error.find(fs::path(f).filename().string()) != std::string::npos;
  EXPECT_TRUE(named) << error;
  ExpectAlive(m.dir());
}

TEST_F(MountHostileTest, ChmodIsRefused) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  for (const std::string& path :
       {m.dir() + "/model/rank-00000/model.safetensors", m.dir() + "/model/rank-00000", m.dir() + "/.ptcfs/status"}) {
    struct stat before, after;
    ASSERT_EQ(stat(path.c_str(), &before), 0) << path;
    errno = 0;
    EXPECT_NE(chmod(path.c_str(), 0777), 0) << path;
    EXPECT_TRUE(errno == EPERM || errno == EROFS) << path << ": " << std::strerror(errno);
    EXPECT_NE(chown(path.c_str(), 1234, 1234), 0) << path;
    ASSERT_EQ(stat(path.c_str(), &after), 0);
    EXPECT_EQ(before.st_mode, after.st_mode) << path;
    EXPECT_EQ(after.st_uid, before.st_uid) << path;
  }
}

TEST_F(MountHostileTest, TimesAreTheCommitTime) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  auto expect_commit_time = [&](const std::string& manifest) {
    struct stat committed;
    ASSERT_EQ(stat(manifest.c_str(), &committed), 0);
    for (const char* rel : {"/model/rank-00000/model.safetensors", "/model/rank-00000",
                            "/model/rank-00001/tensors/dtypes.json", "/model", ""}) {
      struct stat st;
      ASSERT_EQ(stat((m.dir() + rel).c_str(), &st), 0) << rel;
      EXPECT_EQ(st.st_mtime, committed.st_mtime) << rel << " (1970: no time set)";
      EXPECT_EQ(st.st_ctime, committed.st_mtime) << rel;
    }
  };
  expect_commit_time(tmp_ / "store/gen-000001/manifest.json");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a commit a second later
  ASSERT_EQ(WriteConfig(m.dir(), "tp=4"), 0);
  WaitServing(m.dir());
  expect_commit_time(tmp_ / "store/gen-000002/manifest.json");
}

TEST_F(MountHostileTest, ReplacedGenerationGoesWhenItsLastReaderCloses) {
  MakeStore("tp=2,pp=1", tmp_ / "store");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  int a = open((m.dir() + "/model/rank-00000/model.safetensors").c_str(), O_RDONLY);
  int b = open((m.dir() + "/model/rank-00001/optim.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  char byte;
  EXPECT_EQ(read(a, &byte, 1), 1);
  ASSERT_EQ(WriteConfig(m.dir(), "tp=4"), 0);
  WaitServing(m.dir());
  const fs::path old = tmp_ / "store/gen-000001/manifest.json";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(fs::exists(old)) << "removed while files of it were open";
  close(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(fs::exists(old)) << "removed while a file of it was open";
  close(b);  // the last reader: the generation goes, without a later commit
  for (int i = 0; i < 100 && fs::exists(old); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(fs::exists(old)) << "kept after its last reader closed";
  EXPECT_EQ(MountStatus(m.dir())["generation"], 2);
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
  auto [code, out] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(code, 0) << out;
}

// Issue 24, item 6: a shard that is a FIFO blocked the daemon in open(2),
// under a lock every read of the generation took, and kept it alive (holding
// the store lock) after `ptcfs umount`. Now it is refused at once.
TEST_F(MountHostileTest, FifoShardFailsPromptlyAndUmountEnds) {
  const std::string store = tmp_ / "store";
  MakeStore("tp=2,pp=1", store);
  auto [c, o] = Ptcfs("export --config tp=2,pp=1 " + store + " " + tmp_ / "exp");
  ASSERT_EQ(c, 0) << o;
  // Tensor-parallel rank 0's shard of a split tensor: rank 1's files do not use it.
  const std::string tensor = "language_model.encoder.layers.0.self_attention.dense.weight";
  const auto manifest = nlohmann::json::parse(Slurp(store + "/gen-000001/manifest.json"));
  std::string rank0;
  int shards = 0;
  for (const auto& s : manifest["shards"]) {
    if (s["tensor"] != tensor) continue;
    ++shards;
    if (s["boxes"][0][0] == nlohmann::json::array({0, 0})) rank0 = s["file"].get<std::string>();
  }
  ASSERT_EQ(shards, 2) << "the tensor is not split in two";
  ASSERT_FALSE(rank0.empty());
  const std::string shard = store + "/" + rank0;
  fs::rename(shard, tmp_ / "kept.h5");
  ASSERT_EQ(mkfifo(shard.c_str(), 0644), 0);
  {
    Mount m(store, tmp_ / "mnt");
    const std::string timeout = "timeout -k 5 20 ";
    auto [c0, o0] = Sh(timeout + "cat " + m.dir() + "/model/rank-00000/model.safetensors >/dev/null");
    EXPECT_NE(c0, 124) << "the read hung";
    EXPECT_NE(c0, 0);
    EXPECT_NE(o0.find("Input/output error"), std::string::npos) << o0;
    const nlohmann::json status = MountStatus(m.dir());
    const std::string error = status["last_error"].is_string() ? status["last_error"].get<std::string>() : status.dump();
    EXPECT_NE(error.find(shard + ": not a regular file (a FIFO)"), std::string::npos) << error;
    // Another rank's file, of other shards of the same generation, reads bit-exact.
    auto [c1, o1] = Sh(timeout + "cmp " + m.dir() + "/model/rank-00001/model.safetensors " +
                       tmp_ / "exp/rank-00001/model.safetensors");
    EXPECT_EQ(c1, 0) << "(124: hung) " << o1;
    ExpectAlive(m.dir());
    const std::string holder = StoreLock::ReadHolder(store).value();
    ASSERT_TRUE(holder.starts_with("pid ")) << holder;
    auto [cu, ou] = Ptcfs("umount " + m.dir());
    EXPECT_EQ(cu, 0) << ou;
    // The daemon ends and lets go of the store within a few seconds.
    bool released = false;
    for (int i = 0; i < 100 && !released; ++i) {
      released = StoreLock::Acquire(store).ok();  // released again at once
      if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(released) << "the daemon lingers after umount: " << holder;
    if (!released) kill(std::stoi(holder.substr(4)), SIGKILL);  // the daemon this test started
  }
  fs::remove(shard);
  fs::rename(tmp_ / "kept.h5", shard);
  auto [ct, ot] = Ptcfs("transform " + store + " --to tp=1,pp=1");
  EXPECT_EQ(ct, 0) << ot;
  auto [cv, ov] = Ptcfs("verify " + store);
  EXPECT_EQ(cv, 0) << ov;
}

// Issue 41, item 1: a link at STORE/ingest or STORE/ingest/.dcp was followed:
// megatron/ and dcp/ listed the outside directory, a save staged into it, and
// `rm MNT/dcp/a` removed OUTSIDE/a. Now nothing in the staging area is followed
// (fs/staging.h): the outside trees are neither listed nor changed, the
// refusals say EACCES, and the mount serves on.
TEST_F(MountHostileTest, StagingAreaLinksAreNeverFollowed) {
  const std::string store = tmp_ / "store";
  MakeStore("tp=2,pp=1", store);
  const std::string outside = tmp_ / "outside";
  fs::create_directories(outside + "/run/iter_0000005");
  Spit(outside + "/a", "keep me");
  Spit(outside + "/run/iter_0000005/b", "keep me too");
  const auto expect_outside_unchanged = [&] {
    EXPECT_EQ(Slurp(outside + "/a"), "keep me");
    EXPECT_EQ(Slurp(outside + "/run/iter_0000005/b"), "keep me too");
    size_t entries = 0;
    for (auto it = fs::recursive_directory_iterator(outside); it != fs::recursive_directory_iterator(); ++it) ++entries;
    EXPECT_EQ(entries, 4u) << "something was made in " << outside;
  };
  const auto expect_refused = [](const std::string& command) {
    auto [code, out] = Sh(command + " 2>&1");
    EXPECT_NE(code, 0) << command << ": " << out;
  };
  // The root a link.
  fs::create_directory_symlink(outside, store + "/ingest");
  {
    Mount m(store, tmp_ / "mnt", "--format all");
    for (const char* dir : {"/megatron", "/dcp"}) {
      auto [code, out] = Sh("ls -a " + m.dir() + dir);
      EXPECT_EQ(code, 0) << out;
      EXPECT_FALSE(Contains(out, "run")) << dir << " lists the outside directory: " << out;
      EXPECT_FALSE(Contains(out, "\na\n")) << dir << " lists the outside directory: " << out;
    }
    expect_refused("mkdir " + m.dir() + "/dcp/x");
    expect_refused("mkdir " + m.dir() + "/megatron/iter_0000009");
    expect_refused("rm " + m.dir() + "/dcp/a");
    expect_refused("rm -r " + m.dir() + "/megatron/run");
    expect_outside_unchanged();
    ExpectAlive(m.dir());
  }
  EXPECT_TRUE(fs::is_symlink(store + "/ingest")) << "the link itself is the user's to remove";
  // .dcp a link, in a real staging area: megatron/ still takes saves.
  fs::remove(store + "/ingest");
  fs::create_directories(store + "/ingest");
  fs::create_directory_symlink(outside + "/run", store + "/ingest/.dcp");
  {
    Mount m(store, tmp_ / "mnt", "--format all");
    auto [code, out] = Sh("ls -a " + m.dir() + "/dcp");
    EXPECT_EQ(code, 0) << out;
    EXPECT_FALSE(Contains(out, "iter_0000005")) << out;
    expect_refused("mkdir " + m.dir() + "/dcp/x");
    expect_refused("rm -r " + m.dir() + "/dcp/iter_0000005");
    expect_outside_unchanged();
    std::tie(code, out) = Sh("mkdir " + m.dir() + "/megatron/iter_0000009 && rmdir " + m.dir() +
                             "/megatron/iter_0000009 2>&1");
    EXPECT_EQ(code, 0) << out;
    ExpectAlive(m.dir());
  }
  EXPECT_TRUE(fs::is_symlink(store + "/ingest/.dcp"));
}

// Issue 41, item 7: a save that fills the store's disk said EIO; the writer
// now gets ENOSPC ("No space left on device"), what any file system says.
TEST_F(MountHostileTest, AFullStoreDiskSaysNoSpace) {
  const std::string small = tmp_ / "small";
  fs::create_directories(small);
  ASSERT_EQ(Sh("mount -t tmpfs -o size=4m ptcfs-test " + small).first, 0);
  struct Unmount {
    std::string dir;
    ~Unmount() { Sh("umount -l " + dir); }
  } unmount{small};
  const std::string store = small + "/store";
  MakeStore("tp=2,pp=1", store);
  {
    Mount m(store, tmp_ / "mnt", "--format megatron");
    auto [code, out] = Sh("mkdir " + m.dir() + "/megatron/iter_0000009 && dd if=/dev/zero of=" + m.dir() +
                          "/megatron/iter_0000009/big.pt bs=1M count=16 2>&1");
    EXPECT_NE(code, 0) << out;
    EXPECT_TRUE(Contains(out, "No space left on device")) << out;
    ExpectAlive(m.dir());
  }
}

}  // namespace
}  // namespace ptc
