// Hostile stores and inputs, round 3 (issue 24): links planted in a store,
// limits, special files and honest exit codes. Each case failed on the binary
// before its fix; each bad input changes nothing outside what it names.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ptc/base/env.h"
#include "ptc/store/store_lock.h"
#include "mount_util.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";


class HostileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 " + tmp_ / "ckpt" +
              " " + store_);
    ASSERT_EQ(r.first, 0) << r.second;
    // Files a link planted in the store points at: collection must never touch them.
    fs::create_directories(tmp_ / "victim/sub");
    Spit(tmp_ / "victim/a.txt", "precious a");
    Spit(tmp_ / "victim/sub/b.txt", "precious b");
    victim_ = Snapshot(tmp_ / "victim");
  }

  // Imports the checkpoint again (a generation of new pieces only; import
  // collects nothing), then transforms it to `config`, which collects every
  // older generation.
  std::pair<int, std::string> ReimportAndCollect(const std::string& config) {
    auto r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 " +
                   tmp_ / "ckpt" + " " + store_);
    return r.first == 0 ? Ptcfs("transform " + store_ + " --to " + config) : r;
  }

  // Exports the store in `config` and compares every rank file with synth's.
  void ExpectServes(const std::string& config) {
    const std::string out = tmp_ / ("out-" + config);
    auto r = Ptcfs("export --config " + config + " " + store_ + " " + out);
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config " + config + " " + out + "-ref");
    ASSERT_EQ(r.first, 0) << r.second;
    EXPECT_EQ(Snapshot(out), Snapshot(out + "-ref")) << config;
    fs::remove_all(out);
    fs::remove_all(out + "-ref");
  }

  TempDir tmp_;
  std::string store_ = tmp_ / "store";
  std::map<std::string, std::string> victim_;
};

// Item 1: a generation moved to another disk and linked back is read through
// the link, never pruned through it, and only the link goes when collected.
TEST_F(HostileStoreTest, CollectionNeverDeletesThroughAGenerationLink) {
  const std::string moved = tmp_ / "other-disk/gen-000001";
  fs::create_directories(tmp_ / "other-disk");
  fs::rename(store_ + "/gen-000001", moved);
  fs::create_directory_symlink(moved, store_ + "/gen-000001");
  Spit(moved + "/stray.tmp", "not referenced, but not ours to delete through a link");
  const auto moved_before = Snapshot(moved);

  // Copy-free: generation 2 references the pieces behind the link.
  auto r = Ptcfs("transform " + store_ + " --to tp=1,pp=2");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_EQ(Snapshot(moved), moved_before);
  EXPECT_TRUE(fs::is_symlink(store_ + "/gen-000001"));
  ExpectServes("tp=1,pp=2");

  // A new import writes every piece: generation 1 is garbage, its link goes, its files stay.
  r = ReimportAndCollect("tp=2,pp=1");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_FALSE(fs::exists(fs::symlink_status(store_ + "/gen-000001")));
  EXPECT_EQ(Snapshot(moved), moved_before);
  ExpectServes("tp=2,pp=1");
}

// Item 1: a directory inside a generation that links elsewhere, and a
// garbage generation that links to an unrelated directory.
TEST_F(HostileStoreTest, CollectionRemovesPlantedLinksNotTheirTargets) {
  fs::create_directory_symlink(tmp_ / "victim", store_ + "/gen-000001/worker-09");
  auto r = Ptcfs("transform " + store_ + " --to tp=4,pp=1");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_FALSE(fs::exists(fs::symlink_status(store_ + "/gen-000001/worker-09")));
  EXPECT_EQ(Snapshot(tmp_ / "victim"), victim_);

  r = ReimportAndCollect("tp=2,pp=1");  // generations 3 and 4; 1 and 2 collected
  ASSERT_EQ(r.first, 0) << r.second;
  ASSERT_FALSE(fs::exists(store_ + "/gen-000002"));
  fs::create_directory_symlink(tmp_ / "victim", store_ + "/gen-000002");
  r = Ptcfs("transform " + store_ + " --to tp=2,pp=2");  // collects again
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_FALSE(fs::exists(fs::symlink_status(store_ + "/gen-000002")));
  EXPECT_EQ(Snapshot(tmp_ / "victim"), victim_);
  ExpectServes("tp=2,pp=2");
}

// Item 1, the Env: rm -r removes links as links, at the top and inside.
TEST(HostileEnv, RemoveTreeNeverFollowsLinks) {
  TempDir tmp;
  fs::create_directories(tmp / "victim/sub");
  Spit(tmp / "victim/sub/x", "x");
  fs::create_directories(tmp / "tree/inner");
  fs::create_directory_symlink(tmp / "victim", tmp / "tree/inner/link");
  fs::create_directory_symlink(tmp / "victim", tmp / "top-link");
  ASSERT_TRUE(Env::Default()->RemoveTree(tmp / "tree").ok());
  ASSERT_TRUE(Env::Default()->RemoveTree(tmp / "top-link").ok());
  EXPECT_FALSE(fs::exists(tmp / "tree"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp / "top-link")));
  EXPECT_EQ(Slurp(tmp / "victim/sub/x"), "x");
  EXPECT_TRUE(Env::Default()->RemoveTree(tmp / "absent").ok());
}

// Item 2: STORE/lock as a link to a file outside, a hard link, a FIFO.
TEST_F(HostileStoreTest, LockFileIsNeverALinkOrASpecialFile) {
  const std::string outside = tmp_ / "victim/a.txt";
  fs::remove(store_ + "/lock");
  fs::create_symlink(outside, store_ + "/lock");
  auto r = Ptcfs("transform " + store_ + " --to tp=1,pp=2");
  EXPECT_NE(r.first, 0);
  EXPECT_TRUE(Contains(r.second, store_ + "/lock: a symbolic link")) << r.second;
  EXPECT_EQ(Snapshot(tmp_ / "victim"), victim_);

  fs::remove(store_ + "/lock");
  fs::create_hard_link(outside, store_ + "/lock");
  r = Ptcfs("transform " + store_ + " --to tp=1,pp=2");
  EXPECT_NE(r.first, 0);
  EXPECT_TRUE(Contains(r.second, "hard link")) << r.second;
  EXPECT_EQ(Snapshot(tmp_ / "victim"), victim_);

  fs::remove(store_ + "/lock");
  ASSERT_EQ(::mkfifo((store_ + "/lock").c_str(), 0644), 0);
  r = Sh("timeout 20 " + std::string(PTCFS_BINARY) + " transform " + store_ + " --to tp=1,pp=2");
  EXPECT_EQ(r.first, 1) << r.second;  // refused, not hung (timeout exits 124)
  EXPECT_TRUE(Contains(r.second, "not a regular file")) << r.second;
  Result<std::string> holder = StoreLock::ReadHolder(store_);
  EXPECT_FALSE(holder.ok());

  // A regular lock file of the store's own: taken and released as before.
  fs::remove(store_ + "/lock");
  r = Ptcfs("transform " + store_ + " --to tp=1,pp=2");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(store_ + "/lock")));
  ExpectServes("tp=1,pp=2");
}

// Item 7: the commit stands when collection fails; the command says so and
// exits 0. Collection is made to fail by a directory the command may not
// write (run as `nobody` when the test runs as root, who may write anywhere).
TEST_F(HostileStoreTest, ACommitWhoseCollectionFailsSaysSoAndSucceeds) {
  std::string as_user;
  if (::geteuid() == 0) {
    ASSERT_EQ(Sh("chown -R nobody: " + tmp_.path() + " && chmod 0755 " + tmp_.path()).first, 0);
    as_user = AsNobody(tmp_.path());
  }
  // Generation 2 holds new pieces only: the next commit collects generation 1.
  auto r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=2 " + tmp_ / "ckpt" +
                 " " + store_);
  ASSERT_EQ(r.first, 0) << r.second;
  ASSERT_EQ(::chmod((store_ + "/gen-000001/worker-00").c_str(), 0555), 0);
  r = Sh(as_user + PTCFS_BINARY + " transform " + store_ + " --to tp=1,pp=1 2>" + tmp_ / "err");
  const std::string err = Slurp(tmp_ / "err");
  ::chmod((store_ + "/gen-000001/worker-00").c_str(), 0755);
  EXPECT_EQ(r.first, 0) << r.second << err;
  EXPECT_TRUE(Contains(r.second, "generation 3 (tp=1,pp=1,dp=1,per_worker=8) committed")) << r.second;
  EXPECT_TRUE(Contains(err, "ptcfs transform: warning: generation 3 is committed, but removing older generations "
                            "failed: ")) << err;
  EXPECT_TRUE(Contains(err, "left behind: " + store_ + "/gen-000001")) << err;
  EXPECT_TRUE(Contains(Slurp(store_ + "/manifest.json"), "\"generation\":3")) << Slurp(store_ + "/manifest.json");
  ExpectServes("tp=2,pp=2");
  // The next commit collects what was left.
  r = Ptcfs("transform " + store_ + " --to tp=2,pp=1");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_FALSE(fs::exists(store_ + "/gen-000001"));
}

// Item 8: outputs inside the store, a mount over it (the mount side is in
// mount_refusals_test.cc).
TEST_F(HostileStoreTest, ExportIntoTheStoreIsRefused) {
  const auto before = Snapshot(store_);
  for (const std::string& out : {store_ + "/gen-000001", store_ + "/gen-000009", store_ + "/x/y", store_}) {
    auto r = Ptcfs("export --config tp=1,pp=1 " + store_ + " " + out);
    EXPECT_EQ(r.first, 2) << out << ": " << r.second;
    EXPECT_TRUE(Contains(r.second, "ptcfs export: " + out + ": inside the store " + store_)) << r.second;
  }
  fs::create_directory_symlink(store_ + "/gen-000001", tmp_ / "sneaky");
  auto r = Ptcfs("export --config tp=1,pp=1 " + store_ + " " + tmp_ / "sneaky/out");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_EQ(Snapshot(store_), before);
}

// Item 9: a generation number beyond what ptcfs writes, in the root manifest
// and as a directory.
TEST_F(HostileStoreTest, GenerationNumbersOutOfRangeAreNamed) {
  const std::string root = Slurp(store_ + "/manifest.json");
  std::string huge = root;
  const size_t at = huge.find("\"generation\":1");
  ASSERT_NE(at, std::string::npos) << root;
  huge.replace(at, 14, "\"generation\":18446744073709551615");
  Spit(store_ + "/manifest.json", huge);
  auto r = Ptcfs("inspect " + store_);
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, store_ + "/manifest.json: \"generation\" 18446744073709551615 is out of range"))
      << r.second;
  huge.replace(at, 33, "\"generation\":18446744073709551616");
  Spit(store_ + "/manifest.json", huge);
  r = Ptcfs("inspect " + store_);
  EXPECT_TRUE(Contains(r.second, "is out of range")) << r.second;
  Spit(store_ + "/manifest.json", root);

  // A committed-looking directory (a manifest in it): kept by the writers, so it must stop the numbering.
  fs::create_directory(store_ + "/gen-18446744073709551615");
  fs::copy_file(store_ + "/gen-000001/manifest.json", store_ + "/gen-18446744073709551615/manifest.json");
  r = Ptcfs("transform " + store_ + " --to tp=1,pp=2");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, store_ + "/gen-18446744073709551615: numbered above the generations ptcfs writes"))
      << r.second;
  fs::remove_all(store_ + "/gen-18446744073709551615");
  ExpectServes("tp=2,pp=2");
}

// Item 9: a failed write of standard output is an error, and a closed one is
// never a file ptcfs opens.
TEST_F(HostileStoreTest, StandardOutputThatCannotBeWrittenFails) {
  auto r = Sh(std::string(PTCFS_BINARY) + " inspect " + store_ + " >/dev/full");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, "ptcfs inspect: writing standard output: No space left on device")) << r.second;
  r = Sh(std::string(PTCFS_BINARY) + " schema llama >&-");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_TRUE(Contains(r.second, "ptcfs schema: writing standard output: Bad file descriptor")) << r.second;
  // With stdout closed, the lock file would be descriptor 1 and take the
  // command's report line.
  const auto before = Slurp(store_ + "/manifest.json");
  r = Sh(std::string(PTCFS_BINARY) + " transform " + store_ + " --to tp=1,pp=2 >&-");
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_EQ(Slurp(store_ + "/lock"), "");
  EXPECT_NE(Slurp(store_ + "/manifest.json"), before);  // the transform itself committed
  ExpectServes("tp=1,pp=2");
}

// Item 9: messages on one line, inputs cut, ranges named as such.
TEST(HostileCliRound3, UsageErrorsAreOneLineNamingTheCommand) {
  auto r = Ptcfs("transform --bogus x");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs transform: ")) << r.second;
  EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << r.second;
  r = Ptcfs("data view");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs data view: ")) << r.second;
  EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << r.second;
  r = Ptcfs("nosuchcommand");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs: ")) << r.second;
  for (const char* help : {"data import --help", "data synth --help", "mount --help", "--help"}) {
    r = Ptcfs(help);
    EXPECT_EQ(r.first, 0) << help;
    EXPECT_TRUE(r.second.ends_with("\n")) << help << ": " << r.second;
  }
}

TEST(HostileCliRound3, HugeInputsAreCutInMessages) {
  TempDir tmp;
  const std::string formula(1 << 20, '1');
  Spit(tmp / "schema.json", R"({"name": "huge", "tensors": [{"name": "w", "pp": "first", "shape": [")" + formula +
                                R"(+x"]}]})");
  auto r = Ptcfs("synth --schema " + tmp / "schema.json" + " --dims " + kDims + " --config tp=1 " + tmp / "out");
  EXPECT_NE(r.first, 0);
  EXPECT_LT(r.second.size(), 3000u) << r.second.substr(0, 300);
  EXPECT_TRUE(Contains(r.second, "bytes)")) << r.second.substr(0, 300);
}

TEST(HostileCliRound3, DataSynthMakesItsDirectoryAsSynthDoes) {
  TempDir tmp;
  auto r = Ptcfs("data synth --samples 10 --min-len 2 --max-len 4 --vocab 100 " + tmp / "a/b/prefix");
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_TRUE(fs::exists(tmp / "a/b/prefix.idx"));
  EXPECT_TRUE(fs::exists(tmp / "a/b/prefix.bin"));
}

// Item 9: a tampered tensor shape is refused by export as verify refuses it.
TEST_F(HostileStoreTest, ExportRefusesWhatVerifyRefuses) {
  const std::string path = store_ + "/gen-000001/manifest.json";
  nlohmann::json m = nlohmann::json::parse(Slurp(path));
  bool tampered = false;
  for (auto& t : m["tensors"]) {
    if (t["name"] == "language_model.embedding.word_embeddings.weight") {
      t["shape"][0] = t["shape"][0].get<int64_t>() * 2;
      tampered = true;
    }
  }
  ASSERT_TRUE(tampered) << m["tensors"].dump();
  Spit(path, m.dump(2));
  auto v = Ptcfs("verify " + store_);
  EXPECT_NE(v.first, 0) << v.second;
  auto e = Ptcfs("export --config tp=1,pp=1 " + store_ + " " + tmp_ / "out");
  EXPECT_EQ(e.first, 1) << e.second;
  EXPECT_TRUE(Contains(e.second, "tensor 'language_model.embedding.word_embeddings.weight': shape")) << e.second;
  EXPECT_FALSE(fs::exists(tmp_ / "out"));
}

// Item 9: integer options are checked as text: CLI11 alone took -1 as 2^64-1
// and clamped a number too large, so `data synth --samples 10^20` ran.
TEST(HostileCliRound3, IntegerOptionsOutOfRangeAreNamed) {
  TempDir tmp;
  auto r = Ptcfs("data synth --samples 99999999999999999999 --min-len 1 --max-len 2 --vocab 3 " + tmp / "d");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_EQ(r.second, "ptcfs data synth: --samples: 99999999999999999999 is out of range (at most "
                      "18446744073709551615) (ptcfs data synth --help)\n");
  r = Ptcfs("data synth --samples -1 --min-len 1 --max-len 2 --vocab 3 " + tmp / "d");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(r.second.starts_with("ptcfs data synth: --samples: ") && Contains(r.second, "-1")) << r.second;
  r = Ptcfs("compact " + tmp / "s" + " --generation -1");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "--generation: -1 is below 0 (ptcfs compact --help)")) << r.second;
  r = Ptcfs("compact " + tmp / "s" + " --generation 99999999999999999999");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "99999999999999999999 is out of range (-9223372036854775808 to")) << r.second;
  // In range for the type, but more than the disk holds: refused before a byte is written.
  r = Ptcfs("data synth --samples 1000000000000000 --min-len 1000 --max-len 1000 --vocab 3 " + tmp / "d");
  EXPECT_EQ(r.first, 2) << r.second;
  EXPECT_TRUE(Contains(r.second, "free in " + tmp.path())) << r.second;
  EXPECT_FALSE(fs::exists(tmp / "d.bin"));
}

}  // namespace
}  // namespace ptc
