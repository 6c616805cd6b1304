// FIFOs and other special files where a regular file is expected (issue 24,
// item 6): a shard, a rank file, a schema, a lock or staging file that is a
// FIFO used to block forever in open(2). Each is now refused at once with a
// message naming the path and "not a regular file (a FIFO)"; nothing waits.
// The commands run under `timeout` (exit 124: it hung); the calls in this
// process run on a thread that is released (the FIFO's other end opened) and
// failed when it does not return in time. The mount's case is in
// mount_hostile_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include <nlohmann/json.hpp>

#include "fs/staging.h"
#include "ptc/base/env.h"
#include "ptc/model/schema.h"
#include "ptc/store/h5shard.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store_lock.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";
constexpr const char* kFifo = "not a regular file (a FIFO)";
// Longer than any refusal takes, far shorter than a hang.
constexpr const char* kTimeout = "timeout -k 5 20 ";


// Runs fn on a thread. When it has not returned within 10 s it is blocked in
// open(2) of `fifo`: the other end is opened (a reader's and a writer's, each
// without blocking) to release it, and the test fails.
template <typename F>
auto Promptly(const std::string& fifo, F fn) -> decltype(fn()) {
  auto result = std::async(std::launch::async, fn);
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO " << fifo;
    // Opened and closed at once: a reader released reads EOF, not waits.
    const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases a reader
    const int r = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // releases a writer
    if (w >= 0) close(w);
    if (r >= 0) close(r);
  }
  return result.get();
}

void ExpectFifoRefused(const Status& s, const std::string& path) {
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), path + ": " + kFifo)) << s.message();
}

class SpecialFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 --optimizer adam " +
                   tmp_ / "src");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "src" +
              " " + store_);
    ASSERT_EQ(r.first, 0) << r.second;
  }

  // Replaces `path` by a FIFO.
  static void MakeFifo(const std::string& path) {
    fs::remove(path);
    ASSERT_EQ(mkfifo(path.c_str(), 0644), 0) << path;
  }

  // The absolute path of the first shard file of the current generation.
  std::string FirstShard() {
    const auto manifest = nlohmann::json::parse(Slurp(store_ + "/gen-000001/manifest.json"));
    return store_ + "/" + manifest["shards"][0]["file"].get<std::string>();
  }

  TempDir tmp_;
  const std::string store_ = tmp_ / "store";
};

// ptcfs ARGS under timeout; fails the test when it hung (124) or succeeded.
// Returns its output.
std::string RefusedPromptly(const std::string& args) {
  auto [code, out] = Sh(kTimeout + std::string(PTCFS_BINARY) + " " + args);
  EXPECT_NE(code, 124) << "ptcfs " << args << ": hung\n" << out;
  EXPECT_NE(code, 0) << "ptcfs " << args << ": succeeded\n" << out;
  return out;
}

TEST_F(SpecialFilesTest, VerifyAndExportRefuseAFifoShard) {
  const std::string shard = FirstShard();
  MakeFifo(shard);
  std::string out = RefusedPromptly("verify " + store_);
  EXPECT_TRUE(Contains(out, shard + ": " + kFifo)) << out;
  for (const char* format : {"safetensors", "npy", "megatron"}) {
    out = RefusedPromptly("export --format " + std::string(format) + " --config tp=1,pp=1 " + store_ + " " +
                          tmp_ / ("out-" + std::string(format)));
    EXPECT_TRUE(Contains(out, shard + ": " + kFifo)) << format << "\n" << out;
  }
  // Under the same config too (shards served as they are stored).
  out = RefusedPromptly("export --config tp=2,pp=1 " + store_ + " " + tmp_ / "out-same");
  EXPECT_TRUE(Contains(out, shard + ": " + kFifo)) << out;
}

TEST_F(SpecialFilesTest, ImportAndDiffRefuseAFifoRankFile) {
  fs::copy(tmp_ / "src", tmp_ / "bad", fs::copy_options::recursive);
  const std::string fifo = tmp_ / "bad/rank-00001/model.safetensors";
  ASSERT_TRUE(fs::is_regular_file(fifo));
  MakeFifo(fifo);
  const auto before = Snapshot(store_);
  std::string out = RefusedPromptly("import --schema megatron-gpt --dims " + std::string(kDims) +
                                    " --config tp=2,pp=1 " + tmp_ / "bad " + store_);
  EXPECT_TRUE(Contains(out, fifo + ": " + kFifo)) << out;
  EXPECT_TRUE(Snapshot(store_) == before) << "the store changed";
  for (const std::string& dirs : {tmp_ / "src " + tmp_ / "bad", tmp_ / "bad " + tmp_ / "src"}) {
    out = RefusedPromptly("diff --schema megatron-gpt --dims " + std::string(kDims) +
                          " --config-a tp=2,pp=1 --config-b tp=2,pp=1 " + dirs);
    EXPECT_TRUE(Contains(out, fifo + ": " + kFifo)) << out;
    EXPECT_FALSE(Contains(out, "different")) << out;  // an error, not a difference
  }
  // A schema file that is a FIFO.
  const std::string schema = tmp_ / "schema.json";
  MakeFifo(schema);
  out = RefusedPromptly("diff --schema " + schema + " --dims " + kDims + " --config-a tp=2,pp=1 --config-b tp=2,pp=1 " +
                        tmp_ / "src " + tmp_ / "src");
  EXPECT_TRUE(Contains(out, schema + ": " + kFifo)) << out;
}

TEST_F(SpecialFilesTest, InProcessReadersRefuseAFifo) {
  const std::string fifo = tmp_ / "fifo";
  MakeFifo(fifo);
  Env* env = Env::Default();
  ExpectFifoRefused(Promptly(fifo, [&] { return env->OpenRead(fifo).status(); }), fifo);
  ExpectFifoRefused(Promptly(fifo, [&] { return env->OpenExisting(fifo).status(); }), fifo);
  ExpectFifoRefused(env->FileSize(fifo).status(), fifo);
  ExpectFifoRefused(Promptly(fifo, [&] { return ReadFileToString(env, fifo).status(); }), fifo);
  ExpectFifoRefused(Promptly(fifo, [&] { return LoadSchema(fifo).status(); }), fifo);
  // Other special files are named by their type; a regular file still reads.
  Status dir = env->OpenRead(tmp_.path()).status();
  EXPECT_TRUE(Contains(dir.message(), tmp_.path() + ": not a regular file (a directory)")) << dir.ToString();
  Status dev = env->OpenRead("/dev/null").status();
  EXPECT_TRUE(Contains(dev.message(), "/dev/null: not a regular file (a character device)")) << dev.ToString();
  EXPECT_EQ(env->OpenRead(tmp_ / "absent").status().code(), Code::kNotFound);
  Spit(tmp_ / "plain", "bytes");
  EXPECT_EQ(ReadFileToString(env, tmp_ / "plain").value(), "bytes");
  EXPECT_EQ(env->FileSize(tmp_ / "plain").value(), 5u);
}

TEST_F(SpecialFilesTest, ShardCheckLockAndStagingRefuseAFifo) {
  // CheckH5Shard: HDF5 opens the path itself.
  const auto manifest = DecodeManifest("manifest", Slurp(store_ + "/gen-000001/manifest.json"));
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  const ShardRecord& record = manifest->shards.front();
  const std::string shard = store_ + "/" + record.file;
  MakeFifo(shard);
  const DType dtype = FindTensor(*manifest, record.tensor)->dtype;
  ExpectFifoRefused(Promptly(shard, [&] { return CheckH5Shard(shard, record, dtype); }), shard);
  // The store lock's description, read when another process holds it.
  const std::string lock = store_ + "/" + kStoreLockName;
  MakeFifo(lock);
  ExpectFifoRefused(Promptly(lock, [&] { return StoreLock::ReadHolder(store_).status(); }), lock);
  // A staged save's file (STORE/ingest/ of a mount), opened for writing.
  const std::string staged = tmp_ / "ingest/iter_0000001/x.pt";
  fs::create_directories(tmp_ / "ingest/iter_0000001");
  MakeFifo(staged);
  ptcfs::Staging staging(tmp_ / "ingest");
  for (int flags : {O_WRONLY | O_CREAT | O_TRUNC, O_RDONLY, O_RDWR}) {
    ExpectFifoRefused(Promptly(staged, [&] { return staging.Open("iter_0000001/x.pt", flags).status(); }), staged);
  }
}

}  // namespace
}  // namespace ptc
