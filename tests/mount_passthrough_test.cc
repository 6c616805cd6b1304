// FUSE passthrough, for real (docs/mount_format.md, "Passthrough"): the rank
// files of a store compacted with --rank-files are read by the kernel from the
// store's own files; the bytes equal the daemon's (--passthrough off), an open
// file keeps its backing file across a reconfigure, a backing file damaged
// under the mount fails opens with EIO and a message, and a daemon that is not
// root serves everything itself. The same for the Megatron tree's files and
// DCP's chunk files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mount_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

const std::string kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";
// One rank per worker: no shard is shared between two ranks of a worker, so
// every rank file holds all its bytes (view/rank_files.h).
const std::string kConfig = "tp=2,pp=1,dp=1,per_worker=1";

std::string RankFile(int rank, const char* file) {
  char dir[32];
  std::snprintf(dir, sizeof(dir), "rank-%05d", rank);
  return std::string("model/") + dir + "/" + file;
}

class PassthroughTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RequireFuse(); }
  void Synth(const std::string& config, const std::string& dir) {
    auto [code, out] = Ptcfs("synth --schema " + schema_ + " --dims " + kDims +
                             " --optimizer adam --dtype bf16 --config " + config + " " + dir);
    ASSERT_EQ(code, 0) << out;
  }
  // A store of `config` compacted into rank files; src/ holds the expected files.
  void MakeStore(const std::string& config = kConfig, const std::string& compact_flags = "") {
    Synth(config, tmp_ / "src");
    auto [code, out] = Ptcfs("import --schema " + schema_ + " --dims " + kDims + " --config " + config + " " +
                             tmp_ / "src " + tmp_ / "store");
    ASSERT_EQ(code, 0) << out;
    auto [c2, o2] = Ptcfs("compact --rank-files " + compact_flags + " " + tmp_ / "store");
    ASSERT_EQ(c2, 0) << o2;
    auto [c3, o3] = Ptcfs("verify " + tmp_ / "store");
    ASSERT_EQ(c3, 0) << o3;
  }
  // Skips (fails under CI) when this kernel or process cannot do passthrough.
  void RequirePassthrough(const nlohmann::json& status) {
    if (status["passthrough"]["state"] == "on") return;
    std::printf("%s: passthrough is %s\n", InCi() ? "FAIL" : "SKIP", status["passthrough"]["state"].dump().c_str());
    if (InCi()) FAIL() << status.dump();
    GTEST_SKIP();
  }
  // The path on disk of a rank file of the current generation.
  std::string OnDisk(int worker, int rank, const char* file) {
    const auto gen = nlohmann::json::parse(Slurp(tmp_ / "store/manifest.json"))["generation"].get<int>();
    char path[96];
    std::snprintf(path, sizeof(path), "store/gen-%06d/worker-%02d/rank-%05d.%s", gen, worker, rank, file);
    return tmp_ / path;
  }
  std::string schema_ = "megatron-gpt";
  TempDir tmp_;
};

// After a reconfigure: waits until the mount serves, its compaction is done
// and `files` model files go through the kernel.
void WaitCompactedForTheKernel(const std::string& mnt, int files) {
  WaitServing(mnt);
  nlohmann::json status;
  for (int i = 0; i < 300; ++i) {
    status = MountStatus(mnt);
    if (status["compaction"]["state"] == "done" && status["passthrough"]["kernel"] == files) break;
    ASSERT_NE(status["compaction"]["state"], "failed") << status.dump();
    usleep(100 * 1000);
  }
  ASSERT_EQ(status["passthrough"]["kernel"], files) << status.dump();
}

// Waits until the mount's scrub has checked the served generation once (so that
// what a test then damages is found by the test's reads, not by the scrub).
void WaitFirstScrub(const std::string& mnt) {
  nlohmann::json scrub;
  for (int i = 0; i < 300; ++i) {
    scrub = MountStatus(mnt)["passthrough"]["scrub"];
    if (scrub["passes"].get<int>() >= 1) return;
    usleep(100 * 1000);
  }
  FAIL() << "no scrub pass: " << scrub.dump();
}

const std::vector<std::pair<int, const char*>> kFiles = {
    {0, "model.safetensors"}, {0, "optim.safetensors"}, {1, "model.safetensors"}, {1, "optim.safetensors"}};

TEST_F(PassthroughTest, KernelAndDaemonServeTheSameBytes) {
  MakeStore();
  for (const std::string mode : {"auto", "off"}) {
    Mount m(tmp_ / "store", tmp_ / ("mnt-" + mode), "--passthrough " + mode);
    auto status = MountStatus(m.dir());
    if (mode == "auto") RequirePassthrough(status);
    if (mode == "off") {
      EXPECT_EQ(status["passthrough"]["state"], "off: --passthrough off");
    }
    for (const auto& [rank, file] : kFiles) {
      const std::string path = RankFile(rank, file);
      EXPECT_EQ(status["passthrough"]["files"][path], mode == "auto" ? "kernel" : "daemon") << path;
      char dir[32];
      std::snprintf(dir, sizeof(dir), "rank-%05d/", rank);
      auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "src/" + dir + file);
      EXPECT_EQ(c, 0) << mode << " " << o;
      // mmap too (the kernel maps the backing file's pages).
      auto [c2, o2] =
          Sh("python3 -c \"import mmap,sys; f=open(sys.argv[1],'rb'); m=mmap.mmap(f.fileno(),0,"
             "access=mmap.ACCESS_READ); sys.exit(0 if m[:]==open(sys.argv[2],'rb').read() else 1)\" " +
             m.dir() + "/" + path + " " + tmp_ / "src/" + dir + file);
      EXPECT_EQ(c2, 0) << mode << " mmap " << o2;
    }
    // An open file through the kernel holds its backing file's id.
    const int fd = open((m.dir() + "/" + RankFile(0, "model.safetensors")).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(MountStatus(m.dir())["passthrough"]["open_backing_files"], mode == "auto" ? 1 : 0);
    close(fd);
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null());
  }
}

// Every safetensors file of the mount, by the kernel, bytes equal to src/.
void ExpectAllByKernel(const std::string& mnt, const std::string& src, int world) {
  auto status = MountStatus(mnt);
  EXPECT_EQ(status["passthrough"]["daemon"], 0) << status.dump();
  EXPECT_EQ(status["passthrough"]["kernel"], 2 * world) << status.dump();
  for (int rank = 0; rank < world; ++rank) {
    for (const char* file : {"model.safetensors", "optim.safetensors"}) {
      const std::string path = RankFile(rank, file);
      EXPECT_EQ(status["passthrough"]["files"][path], "kernel") << path;
      char dir[32];
      std::snprintf(dir, sizeof(dir), "rank-%05d/", rank);
      auto [c, o] = Sh("cmp " + mnt + "/" + path + " " + src + "/" + dir + file);
      EXPECT_EQ(c, 0) << path << " " << o;
    }
  }
  status = MountStatus(mnt);
  EXPECT_EQ(status["passthrough"]["open_backing_files"], 0) << status.dump();
  EXPECT_TRUE(status["last_error"].is_null()) << status.dump();
}

// Several ranks per worker with tp = 2: replicated norms and biases, and tied
// embeddings, are stored once per worker; the other ranks' files hold copies
// of them (view/rank_files.h), so every file is read by the kernel.
TEST_F(PassthroughTest, RanksSharingPiecesOnAWorkerAllGoThroughTheKernel) {
  const std::string config = "tp=2,pp=2,dp=1,per_worker=2";
  MakeStore(config);
  const auto manifest = nlohmann::json::parse(
      Slurp(fs::path(OnDisk(0, 0, "model.safetensors")).parent_path().parent_path() / "manifest.json"));
  ASSERT_TRUE(manifest.contains("rank_file_copies")) << "no copies written";
  Mount m(tmp_ / "store", tmp_ / "mnt");
  RequirePassthrough(MountStatus(m.dir()));
  ExpectAllByKernel(m.dir(), tmp_ / "src", 4);
}

// Data-parallel replicas on one worker: with --rank-file-copies all the
// replicas' files are whole copies, verified by `ptcfs verify`, which finds
// a damaged copy byte.
TEST_F(PassthroughTest, DataParallelReplicasWithAllCopies) {
  const std::string config = "tp=2,pp=1,dp=2,per_worker=4";
  MakeStore(config, "--rank-file-copies all");
  {
    Mount m(tmp_ / "store", tmp_ / "mnt");
    RequirePassthrough(MountStatus(m.dir()));
    ExpectAllByKernel(m.dir(), tmp_ / "src", 4);
  }
  // Rank 2 (dp 1) stores nothing: its model file is copies only. Damage one byte past the header.
  const std::string copy = OnDisk(0, 2, "model.safetensors");
  ASSERT_TRUE(fs::exists(copy));
  const int fd = open(copy.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const char bad = 0x5a;
  ASSERT_EQ(pwrite(fd, &bad, 1, static_cast<off_t>(fs::file_size(copy)) - 1), 1);
  close(fd);
  auto [c, o] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(c, 1) << o;
  EXPECT_NE(o.find("rank-00002.model.safetensors"), std::string::npos) << o;
}

// Without copies a data-parallel replica's file has the same tensor offsets as
// the first replica's rank file but another header: it is served by the
// daemon, not refused (the first version failed its open with EIO).
TEST_F(PassthroughTest, ReplicaWithoutCopiesGoesThroughTheDaemon) {
  MakeStore("tp=2,pp=1,dp=2,per_worker=4", "--rank-file-copies none");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  RequirePassthrough(MountStatus(m.dir()));
  auto status = MountStatus(m.dir());
  for (int rank = 0; rank < 4; ++rank) {
    const std::string path = RankFile(rank, "model.safetensors");
    EXPECT_EQ(status["passthrough"]["files"][path], rank == 0 ? "kernel" : "daemon") << path;
    char dir[32];
    std::snprintf(dir, sizeof(dir), "rank-%05d/", rank);
    auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "src/" + dir + "model.safetensors");
    EXPECT_EQ(c, 0) << path << " " << o;
  }
  EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null());
}

TEST_F(PassthroughTest, ReconfigureKeepsOpenFilesOnTheirBackingFile) {
  MakeStore();
  Mount m(tmp_ / "store", tmp_ / "mnt", "--compact-pieces 1");
  RequirePassthrough(MountStatus(m.dir()));
  const std::string old_path = m.dir() + "/" + RankFile(0, "model.safetensors");
  const int fd = open(old_path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::string target = "tp=1,pp=2,dp=1,per_worker=1";
  ASSERT_EQ(WriteConfig(m.dir(), target), 0);
  // The compaction writes the new layout's rank files; then they go through the kernel.
  ASSERT_NO_FATAL_FAILURE(WaitCompactedForTheKernel(m.dir(), 4));
  // The file opened before still reads the old layout, from the old generation's rank file.
  std::string old_bytes(fs::file_size(tmp_ / "src/rank-00000/model.safetensors"), '\0');
  ASSERT_EQ(pread(fd, old_bytes.data(), old_bytes.size(), 0), static_cast<ssize_t>(old_bytes.size()));
  EXPECT_TRUE(old_bytes == Slurp(tmp_ / "src/rank-00000/model.safetensors"));
  close(fd);
  Synth(target, tmp_ / "ref");
  for (const auto& [rank, file] : kFiles) {
    char dir[32];
    std::snprintf(dir, sizeof(dir), "rank-%05d/", rank);
    auto [c, o] = Sh("cmp " + m.dir() + "/" + RankFile(rank, file) + " " + tmp_ / "ref/" + dir + file);
    EXPECT_EQ(c, 0) << o;
  }
  // The old generation goes once its last file is closed.
  auto [c, o] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(c, 0) << o;
}

// The Megatron tree's files as rank files (--rank-file-format megatron; a
// mount showing only megatron/ compacts into them itself): read by the kernel,
// bytes equal to `ptcfs export --format megatron` (an independent writer: it
// computes the CRCs while streaming), loadable by torch; the same through the
// daemon. A tree whose store has safetensors rank files goes through the daemon.
TEST_F(PassthroughTest, MegatronTreeFilesGoThroughTheKernel) {
  const std::string config = "tp=2,pp=2,dp=1,per_worker=1";
  MakeStore(config, "--rank-file-format megatron");
  auto [c0, o0] = Ptcfs("export --format megatron --config " + config + " " + tmp_ / "store " + tmp_ / "ref");
  ASSERT_EQ(c0, 0) << o0;
  const std::vector<std::string> files = {"iter_0000000/mp_rank_00_000", "iter_0000000/mp_rank_00_001",
                                          "iter_0000000/mp_rank_01_000", "iter_0000000/mp_rank_01_001"};
  for (const std::string mode : {"auto", "off"}) {
    Mount m(tmp_ / "store", tmp_ / ("mnt-" + mode), "--format megatron --passthrough " + mode);
    auto status = MountStatus(m.dir());
    if (mode == "auto") RequirePassthrough(status);
    EXPECT_EQ(status["passthrough"]["kernel"], mode == "auto" ? 4 : 0) << status.dump();
    for (const std::string& dir : files) {
      const std::string path = "megatron/" + dir + "/model_optim_rng.pt";
      EXPECT_EQ(status["passthrough"]["files"][path], mode == "auto" ? "kernel" : "daemon") << path;
      auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "ref/" + dir + "/model_optim_rng.pt");
      EXPECT_EQ(c, 0) << mode << " " << o;
    }
    auto [c, o] =
        Sh("/usr/bin/python3 -c \"import glob, sys, torch\n"
           "for f in sorted(glob.glob(sys.argv[1] + '/megatron/iter_*/*/model_optim_rng.pt')):\n"
           "    sd = torch.load(f, map_location='cpu')\n"
           "    assert sd['model'] and sd['optimizer'], f\n"
           "print('loaded')\" " +
           m.dir());
    EXPECT_EQ(c, 0) << o;
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null());
  }
  // Compacted into safetensors rank files instead: the tree is served by the daemon, not refused.
  auto [c1, o1] = Ptcfs("compact --rank-files " + tmp_ / "store");
  ASSERT_EQ(c1, 0) << o1;
  Mount m(tmp_ / "store", tmp_ / "mnt-safetensors", "--format megatron --compact-pieces 1");
  RequirePassthrough(MountStatus(m.dir()));
  EXPECT_EQ(MountStatus(m.dir())["passthrough"]["daemon"], 4) << MountStatus(m.dir()).dump();
  // A change of layout: the mount's compaction writes the new tree's files as rank files.
  const std::string target = "tp=1,pp=2,dp=1,per_worker=1";
  ASSERT_EQ(WriteConfig(m.dir(), target), 0);
  ASSERT_NO_FATAL_FAILURE(WaitCompactedForTheKernel(m.dir(), 2));
  auto [c2, o2] = Ptcfs("export --format megatron --config " + target + " " + tmp_ / "store " + tmp_ / "ref2");
  ASSERT_EQ(c2, 0) << o2;
  for (const std::string dir : {"iter_0000000/mp_rank_00_000", "iter_0000000/mp_rank_00_001"}) {
    auto [c, o] = Sh("cmp " + m.dir() + "/megatron/" + dir + "/model_optim_rng.pt " + tmp_ / "ref2/" + dir +
                     "/model_optim_rng.pt");
    EXPECT_EQ(c, 0) << o;
  }
}

// DCP's chunk files (dcp/, and megatron/'s torch_dist tree): compacted with
// --rank-file-format dcp (torch_dist), each worker's __W_0.distcp is a file
// of the store, its pieces (a llama's fused fc1 one per box) inside zip
// records, and the kernel reads it; the bytes equal the daemon's and `ptcfs
// export --format dcp`. A change of layout: the mount's compaction writes the
// new layout's chunk files.
TEST_F(PassthroughTest, DcpChunkFilesGoThroughTheKernel) {
  schema_ = "llama";
  const std::string config = "tp=2,pp=2,dp=1,per_worker=2";  // two workers: __0_0.distcp and __1_0.distcp
  MakeStore(config, "--rank-file-format dcp");
  auto [c0, o0] = Ptcfs("export --format dcp " + tmp_ / "store " + tmp_ / "ref");
  ASSERT_EQ(c0, 0) << o0;
  const std::vector<std::string> files = {"dcp/__0_0.distcp", "dcp/__1_0.distcp"};
  for (const std::string mode : {"off", "auto"}) {
    Mount m(tmp_ / "store", tmp_ / ("mnt-" + mode), "--format dcp --compact-pieces 1 --passthrough " + mode);
    auto status = MountStatus(m.dir());
    if (mode == "auto") RequirePassthrough(status);
    EXPECT_EQ(status["passthrough"]["kernel"], mode == "auto" ? 2 : 0) << status.dump();
    for (const std::string& path : files) {
      EXPECT_EQ(status["passthrough"]["files"][path], mode == "auto" ? "kernel" : "daemon") << path;
      auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "ref/" + fs::path(path).filename().string());
      EXPECT_EQ(c, 0) << mode << " " << o;
    }
    if (mode == "off") continue;
    // A change of layout: the compaction writes the new generation's chunk files, read by the kernel again.
    const std::string target = "tp=1,pp=2,dp=1,per_worker=1";
    ASSERT_EQ(WriteConfig(m.dir(), target), 0);
    ASSERT_NO_FATAL_FAILURE(WaitCompactedForTheKernel(m.dir(), 2));
    auto [c1, o1] = Ptcfs("export --format dcp " + tmp_ / "store " + tmp_ / "ref2");
    ASSERT_EQ(c1, 0) << o1;
    for (const std::string& path : files) {
      auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "ref2/" + fs::path(path).filename().string());
      EXPECT_EQ(c, 0) << o;
    }
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
  }
  // megatron/'s torch_dist tree: the same chunks in Megatron-Core's keys. The
  // dcp/ rank files hold its pieces at the very offsets but other records: not
  // its backing files, served by the daemon (no EIO, no error).
  {
    Mount m(tmp_ / "store", tmp_ / "mnt-dist-before", "--format megatron --ckpt-format torch_dist");
    EXPECT_EQ(MountStatus(m.dir())["passthrough"]["kernel"], 0) << MountStatus(m.dir()).dump();
    auto [c, o] = Sh("cat " + m.dir() + "/megatron/iter_0000000/__0_0.distcp >/dev/null");
    EXPECT_EQ(c, 0) << o;
    EXPECT_TRUE(MountStatus(m.dir())["last_error"].is_null()) << MountStatus(m.dir()).dump();
  }
  auto [c2, o2] = Ptcfs("compact --rank-files --rank-file-format torch_dist " + tmp_ / "store");
  ASSERT_EQ(c2, 0) << o2;
  std::map<std::string, std::string> by_mode;  // the daemon's and the kernel's bytes of the tree's files
  for (const std::string mode : {"off", "auto"}) {
    Mount m(tmp_ / "store", tmp_ / ("mnt-dist-" + mode),
            "--format megatron --ckpt-format torch_dist --passthrough " + mode);
    auto status = MountStatus(m.dir());
    EXPECT_EQ(status["passthrough"]["kernel"], mode == "auto" ? 2 : 0) << status.dump();
    for (const char* name : {"__0_0.distcp", "__1_0.distcp"}) {
      const std::string path = std::string("megatron/iter_0000000/") + name;
      EXPECT_EQ(status["passthrough"]["files"][path], mode == "auto" ? "kernel" : "daemon") << path;
      by_mode[mode] += Slurp(m.dir() + "/" + path);
    }
  }
  EXPECT_FALSE(by_mode["auto"].empty());
  EXPECT_TRUE(by_mode["auto"] == by_mode["off"]);

  // torchtitan's names: its woven q/k heads and the parts of linear_qkv's
  // pieces (wv, the fused wqkv's v rows) are no whole pieces, in __W_1.distcp
  // (the daemon's); __W_0.distcp holds the rest, read by the kernel.
  auto [c3, o3] = Ptcfs("compact --rank-files --rank-file-format dcp --dcp-names torchtitan " + tmp_ / "store");
  ASSERT_EQ(c3, 0) << o3;
  auto [c4, o4] = Ptcfs("export --format dcp --dcp-names torchtitan " + tmp_ / "store " + tmp_ / "ref-titan");
  ASSERT_EQ(c4, 0) << o4;
  Mount m(tmp_ / "store", tmp_ / "mnt-titan", "--format dcp --dcp-names torchtitan");
  auto status = MountStatus(m.dir());
  EXPECT_EQ(status["passthrough"]["kernel"], 2) << status.dump();
  EXPECT_EQ(status["passthrough"]["daemon"], 2) << status.dump();
  for (const char* name : {"__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"}) {
    const std::string path = std::string("dcp/") + name;
    EXPECT_EQ(status["passthrough"]["files"][path], std::string(name).ends_with("_0.distcp") ? "kernel" : "daemon")
        << path;
    auto [c, o] = Sh("cmp " + m.dir() + "/" + path + " " + tmp_ / "ref-titan/" + name);
    EXPECT_EQ(c, 0) << o;
  }
}

TEST_F(PassthroughTest, DamagedBackingFileFailsOpensWithEio) {
  MakeStore();
  Mount m(tmp_ / "store", tmp_ / "mnt");
  RequirePassthrough(MountStatus(m.dir()));
  ASSERT_NO_FATAL_FAILURE(WaitFirstScrub(m.dir()));
  // Truncated under the mount.
  const std::string truncated = OnDisk(1, 1, "model.safetensors");
  ASSERT_EQ(truncate(truncated.c_str(), 1000), 0);
  int fd = open((m.dir() + "/" + RankFile(1, "model.safetensors")).c_str(), O_RDONLY);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EIO);
  auto status = MountStatus(m.dir());
  EXPECT_NE(status["last_error"].get<std::string>().find(fs::path(truncated).filename().string()), std::string::npos)
      << status.dump();
  EXPECT_NE(status["last_error"].get<std::string>().find("truncated"), std::string::npos) << status.dump();
  // Removed under the mount.
  const std::string removed = OnDisk(0, 0, "optim.safetensors");
  ASSERT_EQ(unlink(removed.c_str()), 0);
  fd = open((m.dir() + "/" + RankFile(0, "optim.safetensors")).c_str(), O_RDONLY);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EIO);
  status = MountStatus(m.dir());
  EXPECT_NE(status["last_error"].get<std::string>().find(fs::path(removed).filename().string()), std::string::npos)
      << status.dump();
  // The daemon is alive and the other files read on.
  auto [c, o] =
      Sh("cmp " + m.dir() + "/" + RankFile(0, "model.safetensors") + " " + tmp_ / "src/rank-00000/model.safetensors");
  EXPECT_EQ(c, 0) << o;
}

// Issue 41, item 10: a byte flipped in a compacted rank file was served
// silently by the kernel (the daemon checks every block it serves; the kernel
// checks nothing). The scrub reads every stored block back against its
// checksum, after each generation served and then every --scrub-interval: the
// file leaves the passthrough, .ptcfs/status names it, and a read of it fails
// with EIO instead of returning the rotten byte. A rank file that is a
// symbolic link is never given to the kernel.
TEST_F(PassthroughTest, TheScrubTakesARottenFileOutOfThePassthrough) {
  MakeStore();
  const std::string rotten = RankFile(0, "model.safetensors"), sound = RankFile(1, "model.safetensors");
  {
    Mount m(tmp_ / "store", tmp_ / "mnt", "--scrub-interval 1");
    RequirePassthrough(MountStatus(m.dir()));
    ASSERT_NO_FATAL_FAILURE(WaitFirstScrub(m.dir()));
    const nlohmann::json scrub = MountStatus(m.dir())["passthrough"]["scrub"];
    EXPECT_GT(scrub["bytes_checked"].get<uint64_t>(), 0u) << scrub.dump();
    EXPECT_TRUE(scrub["bad_files"].empty()) << scrub.dump();
    // One byte of a tensor flipped on disk, under the mount.
    const std::string on_disk = OnDisk(0, 0, "model.safetensors");
    const auto size = fs::file_size(on_disk);
    {
      const int fd = open(on_disk.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      char byte;
      ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(size - 7)), 1);
      byte = static_cast<char>(byte ^ 0x40);
      ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(size - 7)), 1);
      close(fd);
    }
    nlohmann::json status;
    for (int i = 0; i < 100; ++i) {
      status = MountStatus(m.dir());
      if (!status["passthrough"]["scrub"]["bad_files"].empty()) break;
      usleep(100 * 1000);
    }
    ASSERT_EQ(status["passthrough"]["scrub"]["bad_files"].size(), 1u) << status.dump();
    const std::string bad = status["passthrough"]["scrub"]["bad_files"][0];
    EXPECT_EQ(fs::path(bad).filename(), fs::path(on_disk).filename()) << bad;
    EXPECT_NE(status["last_error"].get<std::string>().find("scrub"), std::string::npos) << status.dump();
    EXPECT_EQ(status["passthrough"]["files"][rotten], "daemon") << status.dump();
    EXPECT_EQ(status["passthrough"]["files"][sound], "kernel") << status.dump();
    auto [c, o] = Sh("cat " + m.dir() + "/" + rotten + " >/dev/null 2>&1; echo $?; cat " + m.dir() + "/" + rotten +
                     " 2>&1 >/dev/null");
    EXPECT_TRUE(Contains(o, "Input/output error")) << "the rotten byte was served: " << o;
    std::tie(c, o) = Sh("cmp " + m.dir() + "/" + sound + " " + tmp_ / "src/rank-00001/model.safetensors");
    EXPECT_EQ(c, 0) << o;
  }
  // A rank file replaced by a link to a copy of itself: read by the daemon, never the kernel.
  const std::string linked = OnDisk(1, 1, "model.safetensors");
  fs::copy_file(linked, tmp_ / "elsewhere.safetensors");
  fs::remove(linked);
  fs::create_symlink(tmp_ / "elsewhere.safetensors", linked);
  Mount m(tmp_ / "store", tmp_ / "mnt2");
  EXPECT_EQ(MountStatus(m.dir())["passthrough"]["files"][sound], "daemon") << MountStatus(m.dir()).dump();
  auto [c, o] = Sh("cmp " + m.dir() + "/" + sound + " " + tmp_ / "src/rank-00001/model.safetensors");
  EXPECT_EQ(c, 0) << o;
}

TEST_F(PassthroughTest, NonRootDaemonServesEverything) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  MakeStore();
  // The daemon runs as nobody (through fusermount3); /dev/fuse must let it in.
  struct stat dev;
  ASSERT_EQ(stat("/dev/fuse", &dev), 0);
  ASSERT_EQ(chmod("/dev/fuse", 0666), 0);
  struct Restore {
    mode_t mode;
    ~Restore() { chmod("/dev/fuse", mode); }
  } restore{dev.st_mode & 07777};
  ASSERT_EQ(Sh("chmod 755 " + tmp_.path() + " && chown -R 65534:65534 " + tmp_ / "store").first, 0);
  const std::string nobody = AsNobody(tmp_.path());
  fs::create_directories(tmp_ / "mnt");
  ASSERT_EQ(Sh("chown 65534:65534 " + tmp_ / "mnt").first, 0);
  auto [code, out] = Sh(nobody + PTCFS_BINARY + " mount " + tmp_ / "store " + tmp_ / "mnt");
  ASSERT_EQ(code, 0) << out;
  struct Unmount {
    std::string dir;
    ~Unmount() { Sh("fusermount3 -u " + dir); }
  } unmount{tmp_ / "mnt"};
  auto [c, text] = Sh(nobody + "cat " + tmp_ / "mnt/.ptcfs/status");
  ASSERT_EQ(c, 0) << text;
  auto status = nlohmann::json::parse(text);
  EXPECT_EQ(status["passthrough"]["state"],
            "off: registering backing files needs CAP_SYS_ADMIN (the daemon is not root)")
      << text;
  EXPECT_EQ(status["passthrough"]["kernel"], 0) << text;
  for (const auto& [rank, file] : kFiles) {
    char dir[32];
    std::snprintf(dir, sizeof(dir), "rank-%05d/", rank);
    auto [c2, o2] = Sh(nobody + "cmp " + tmp_ / "mnt/" + RankFile(rank, file) + " " + tmp_ / "src/" + dir + file);
    EXPECT_EQ(c2, 0) << o2;
  }
}

}  // namespace
}  // namespace ptc
