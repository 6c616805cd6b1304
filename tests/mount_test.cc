// The mount, for real: files read with cmp and Python (numpy), reconfigured
// under concurrent readers, and bad inputs. Every test unmounts, also when it
// fails (the Mount object's destructor).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mount_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";

class MountTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testing::RequireFuse(); }
  void Synth(const std::string& config, const std::string& dir) {
    auto [code, out] = Ptcfs("synth --schema megatron-gpt --dims " + kDims +
                             " --optimizer adam --dtype bf16 --config " + config + " " + dir);
    ASSERT_EQ(code, 0) << out;
  }
  void MakeStore(const std::string& config) {
    Synth(config, tmp_ / "src");
    auto [code, out] = Ptcfs("import --schema megatron-gpt --dims " + kDims + " --config " + config + " " +
                             tmp_ / "src " + tmp_ / "store");
    ASSERT_EQ(code, 0) << out;
  }
  // Reference files of `config`: its synth checkpoint.
  std::string Reference(const std::string& config) {
    const std::string dir = tmp_ / ("ref-" + std::to_string(refs_++));
    Synth(config, dir);
    return dir;
  }
  TempDir tmp_;
  int refs_ = 0;
};

TEST_F(MountTest, FilesEqualExportForCmpNumpyAndPython) {
  MakeStore("tp=2,pp=2,dp=2,per_worker=4");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  auto [code, out] = Ptcfs("export --config tp=2,pp=2,dp=2,per_worker=4 " + tmp_ / "store " + tmp_ / "exp");
  ASSERT_EQ(code, 0) << out;
  auto [c2, o2] = Ptcfs("export --format npy --config tp=2,pp=2,dp=2,per_worker=4 " + tmp_ / "store " + tmp_ / "exp");
  ASSERT_NE(c2, 0);  // export refuses a non-empty directory
  for (int r = 0; r < 8; ++r) {
    char rank[32];
    std::snprintf(rank, sizeof(rank), "rank-%05d", r);
    for (const char* f : {"model.safetensors", "optim.safetensors"}) {
      auto [c, o] = Sh("cmp " + m.dir() + "/model/" + rank + "/" + f + " " + tmp_ / "exp/" + rank + "/" + f);
      EXPECT_EQ(c, 0) << o;
      struct stat st;
      ASSERT_EQ(stat((m.dir() + "/model/" + rank + "/" + f).c_str(), &st), 0);
      EXPECT_EQ(static_cast<uintmax_t>(st.st_size), fs::file_size(tmp_ / "exp/" + rank + "/" + f));
    }
  }
  // ls -lR and cp -r work; npy files through numpy equal an npy export.
  EXPECT_EQ(Sh("ls -lR " + m.dir() + " > /dev/null").first, 0);
  EXPECT_EQ(Sh("cp -r " + m.dir() + "/model " + tmp_ / "copy").first, 0);
  EXPECT_EQ(Sh("cmp " + tmp_ / "copy/rank-00005/model.safetensors " + tmp_ / "exp/rank-00005/model.safetensors").first,
            0);
  auto [c3, o3] = Ptcfs("export --format npy --config tp=2,pp=2,dp=2,per_worker=4 " + tmp_ / "store " + tmp_ / "npy");
  ASSERT_EQ(c3, 0) << o3;
  for (const auto& e : fs::directory_iterator(tmp_ / "npy")) {
    fs::copy(e.path() / "tensors", tmp_ / "exp" / e.path().filename() / "tensors", fs::copy_options::recursive);
  }
  auto [c4, o4] = Sh("/usr/bin/python3 " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/compare_tensors.py " +
                     m.dir() + "/model " + tmp_ / "exp");
  EXPECT_EQ(c4, 0) << o4;
  EXPECT_NE(o4.find("equal:"), std::string::npos) << o4;
}

TEST_F(MountTest, ReconfigureUnderConcurrentReaders) {
  const std::vector<std::string> configs = {"tp=2,pp=2,dp=1", "tp=4,pp=1,dp=1", "tp=1,pp=2,pp_layers=1+3,dp=2,zero=1",
                                            "tp=2,pp=1,dp=3,zero=1", "tp=2,pp=2,dp=1"};
  MakeStore(configs[0]);
  Mount m(tmp_ / "store", tmp_ / "mnt");
  std::vector<std::string> refs;
  for (const std::string& c : configs) refs.push_back(Reference(c));
  for (size_t step = 1; step < configs.size(); ++step) {
    SCOPED_TRACE(configs[step - 1] + " -> " + configs[step]);
    // Each file a reader reads must equal the old or the new config's file completely.
    std::map<std::string, std::set<std::string>> allowed;
    for (size_t k : {step - 1, step}) {
      for (const auto& e : fs::directory_iterator(refs[k])) {
        allowed[e.path().filename().string()].insert(Slurp(e.path() / "model.safetensors"));
      }
    }
    std::atomic<bool> stop{false};
    std::atomic<int> reads{0}, bad{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 4; ++t) {
      readers.emplace_back([&] {
        while (!stop) {
          std::error_code ec;
          for (const auto& e : fs::directory_iterator(m.dir() + "/model", ec)) {
            std::string bytes = Slurp(e.path() / "model.safetensors");
            if (bytes.empty()) continue;  // the rank vanished with the old layout
            const auto& ok = allowed[e.path().filename().string()];
            if (!ok.count(bytes)) bad++;
            reads++;
          }
        }
      });
    }
    ASSERT_EQ(WriteConfig(m.dir(), configs[step] + "\n"), 0);
    WaitServing(m.dir());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
    for (auto& r : readers) r.join();
    EXPECT_EQ(bad, 0) << "a reader saw a file mixed from two layouts";
    EXPECT_GT(reads, 0);
    auto s = testing::MountStatus(m.dir());
    EXPECT_EQ(s["generation"], step + 1);
    // After the commit every file equals the new config's reference.
    for (const auto& e : fs::directory_iterator(refs[step])) {
      const std::string rank = e.path().filename().string();
      for (const char* f : {"model.safetensors", "optim.safetensors"}) {
        auto [cc, oo] = Sh("cmp " + m.dir() + "/model/" + rank + "/" + f + " " + (e.path() / f).string());
        EXPECT_EQ(cc, 0) << oo;
      }
    }
  }
}

TEST_F(MountTest, OpenFileKeepsItsGeneration) {
  MakeStore("tp=2,pp=1");
  Mount m(tmp_ / "store", tmp_ / "mnt");
  const std::string old_ref = Reference("tp=2,pp=1");
  std::ifstream held(m.dir() + "/model/rank-00000/model.safetensors", std::ios::binary);
  ASSERT_TRUE(held.good());
  ASSERT_EQ(WriteConfig(m.dir(), "tp=4"), 0);
  WaitServing(m.dir());
  std::stringstream s;
  s << held.rdbuf();
  EXPECT_TRUE(s.str() == Slurp(old_ref + "/rank-00000/model.safetensors")) << "an open file changed generation";
  EXPECT_TRUE(fs::exists(tmp_ / "store/gen-000001/manifest.json")) << "removed while a file of it was open";
  held.close();
  // The next commit removes what no open file and no current shard needs,
  // just after the status says serving.
  ASSERT_EQ(WriteConfig(m.dir(), "tp=2"), 0);
  WaitServing(m.dir());
  const auto manifest = nlohmann::json::parse(Slurp(tmp_ / "store/gen-000003/manifest.json"));
  std::set<std::string> referenced, present;
  for (const auto& shard : manifest["shards"]) referenced.insert(shard["file"].get<std::string>());
  for (int i = 0; i < 200; ++i) {
    present.clear();
    try {  // the removal may be under way: a directory can vanish during the walk
      for (const auto& e : fs::recursive_directory_iterator(tmp_ / "store")) {
        if (e.path().extension() == ".h5") present.insert(fs::relative(e.path(), tmp_ / "store").string());
      }
    } catch (const fs::filesystem_error&) {
      continue;
    }
    if (present == referenced && !fs::exists(tmp_ / "store/gen-000002") &&
        !fs::exists(tmp_ / "store/gen-000001/manifest.json")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(present, referenced);
  EXPECT_FALSE(fs::exists(tmp_ / "store/gen-000001/manifest.json"));
  EXPECT_FALSE(fs::exists(tmp_ / "store/gen-000002/manifest.json"));
  auto [code, out] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(code, 0) << out;
}

TEST_F(MountTest, BadInputs) {
  MakeStore("tp=2,pp=2");
  {
    Mount m(tmp_ / "store", tmp_ / "mnt");
    EXPECT_EQ(WriteConfig(m.dir(), "this is not a config"), EINVAL);
    EXPECT_NE(testing::MountStatus(m.dir())["last_error"].get<std::string>().find("not key=value"), std::string::npos);
    EXPECT_EQ(WriteConfig(m.dir(), "tp=3,pp=2"), EINVAL);
    EXPECT_NE(testing::MountStatus(m.dir())["last_error"].get<std::string>().find("tp=3 does not divide"),
              std::string::npos)
        << testing::MountStatus(m.dir()).dump();
    EXPECT_EQ(testing::MountStatus(m.dir())["config"], "tp=2,pp=2,dp=1,per_worker=8");
    EXPECT_EQ(testing::MountStatus(m.dir())["generation"], 1);
    int fd = open((m.dir() + "/model/rank-00000/model.safetensors").c_str(), O_WRONLY);
    EXPECT_LT(fd, 0);
    EXPECT_EQ(errno, EACCES);
    auto [c, o] = Ptcfs("reconfigure " + m.dir() + " --to tp=5");
    EXPECT_NE(c, 0);
    EXPECT_NE(o.find("tp=5 does not divide"), std::string::npos) << o;
  }
  // A corrupted shard: reads of files built from it fail with EIO; status names it.
  auto manifest = nlohmann::json::parse(Slurp(tmp_ / "store/gen-000001/manifest.json"));
  std::string tensor, file;
  size_t offset = 0;
  for (const auto& s : manifest["shards"]) {
    if (s["tensor"] == "language_model.encoder.layers.0.self_attention.dense.weight") {
      tensor = s["tensor"];
      file = s["file"];
      offset = s["offset"];
      break;
    }
  }
  ASSERT_FALSE(file.empty());
  {
    std::fstream f(tmp_ / "store/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset + 3));
    f.put('\x5a');
  }
  {
    Mount m(tmp_ / "store", tmp_ / "mnt");
    auto [c, o] = Sh("cat " + m.dir() + "/model/rank-00000/model.safetensors >/dev/null");
    EXPECT_NE(c, 0);
    EXPECT_NE(o.find("Input/output error"), std::string::npos) << o;
    EXPECT_NE(testing::MountStatus(m.dir())["last_error"].get<std::string>().find(tensor), std::string::npos)
        << testing::MountStatus(m.dir()).dump();
  }
  // Missing or invalid store: clear error, non-zero exit, nothing mounted.
  fs::create_directories(tmp_ / "mnt2");
  auto [c, o] = Ptcfs("mount " + tmp_ / "nowhere " + tmp_ / "mnt2");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find(tmp_ / "nowhere"), std::string::npos) << o;
  EXPECT_NE(Sh("mountpoint -q " + tmp_ / "mnt2").first, 0);
  fs::create_directories(tmp_ / "junk");
  std::ofstream(tmp_ / "junk/manifest.json") << "{]";
  std::tie(c, o) = Ptcfs("mount " + tmp_ / "junk " + tmp_ / "mnt2");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find("manifest.json"), std::string::npos) << o;
  EXPECT_NE(Sh("mountpoint -q " + tmp_ / "mnt2").first, 0);
}

// Checksums are checked per 4 MiB block of a shard: a read needs only the blocks
// it touches, so a corrupt block fails the reads of its bytes and no others.
TEST_F(MountTest, CorruptBlockFailsOnlyTheReadsThatNeedIt) {
  const std::string dims = "layers=1,hidden=1024,heads=8,vocab=4096,seq=16";
  auto [code, out] = Ptcfs("synth --schema megatron-gpt --dims " + dims + " --config tp=1,pp=1 " + tmp_ / "src");
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) =
      Ptcfs("import --schema megatron-gpt --dims " + dims + " --config tp=1,pp=1 " + tmp_ / "src " + tmp_ / "store");
  ASSERT_EQ(code, 0) << out;
  const std::string tensor = "language_model.embedding.word_embeddings.weight";  // 4096 x 1024 f32: 4 blocks
  auto manifest = nlohmann::json::parse(Slurp(tmp_ / "store/gen-000001/manifest.json"));
  nlohmann::json shard;
  for (const auto& s : manifest["shards"]) {
    if (s["tensor"] == tensor) shard = s;
  }
  ASSERT_TRUE(shard.is_object());
  ASSERT_EQ(shard["block_checksums"].get<std::string>().size(), 4u * 16);
  {
    std::fstream f(tmp_ / "store/" + shard["file"].get<std::string>(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(shard["offset"].get<uint64_t>() + (3u << 22) + 10));
    f.put('\x5a');
  }
  // Where the tensor's bytes lie in the rank's safetensors file.
  const std::string ref = Slurp(tmp_ / "src/rank-00000/model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, ref.data(), 8);
  const auto header = nlohmann::json::parse(ref.substr(8, header_len));
  const uint64_t begin = 8 + header_len + header[tensor]["data_offsets"][0].get<uint64_t>();

  Mount m(tmp_ / "store", tmp_ / "mnt");
  const std::string file = m.dir() + "/model/rank-00000/model.safetensors";
  const int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string got(1 << 20, '\0');
  const ssize_t n = ::pread(fd, got.data(), got.size(), static_cast<off_t>(begin + (2u << 22)));  // block 2
  const int err = errno;
  ::close(fd);
  ASSERT_EQ(n, static_cast<ssize_t>(got.size())) << std::strerror(err);
  EXPECT_EQ(got, ref.substr(begin + (2u << 22), got.size()));
  EXPECT_TRUE(testing::MountStatus(m.dir())["last_error"].is_null()) << testing::MountStatus(m.dir()).dump();

  auto [c, o] = Sh("cat " + file + " >/dev/null");
  EXPECT_NE(c, 0);
  EXPECT_NE(o.find("Input/output error"), std::string::npos) << o;
  const std::string error = testing::MountStatus(m.dir())["last_error"].get<std::string>();
  EXPECT_NE(error.find(tensor), std::string::npos) << error;
  EXPECT_NE(error.find("checksum of block 3 (bytes 12582912-16777216)"), std::string::npos) << error;
}

// A reconfigure commits a covering of the stored pieces (no tensor bytes
// written); when the new layout's shards are read from more pieces than the
// policy allows, the mount compacts in the background and serves the
// compacted generation: the same bytes, one piece per shard.
TEST_F(MountTest, FragmentedLayoutIsCompactedInTheBackground) {
  MakeStore("tp=4,pp=1");
  Mount m(tmp_ / "store", tmp_ / "mnt", "--compact-pieces 1.5");
  const std::string ref = Reference("tp=1,pp=2");
  ASSERT_EQ(WriteConfig(m.dir(), "tp=1,pp=2\n"), 0);
  WaitServing(m.dir());
  nlohmann::json s;
  for (int i = 0; i < 600; ++i) {
    s = testing::MountStatus(m.dir());
    if (s["compaction"]["state"] != "running" && s["generation"] == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(s["compaction"]["state"], "done") << s.dump();
  EXPECT_EQ(s["generation"], 3) << s.dump();  // 2: the covering; 3: the compaction
  EXPECT_EQ(s["compaction"]["pieces"], s["compaction"]["shards"]) << s.dump();
  EXPECT_GT(s["compaction"]["bytes_total"].get<uint64_t>(), 0u) << s.dump();
  EXPECT_EQ(s["compaction"]["bytes_done"], s["compaction"]["bytes_total"]) << s.dump();
  EXPECT_TRUE(s["last_error"].is_null()) << s.dump();
  for (const auto& e : fs::directory_iterator(ref)) {
    const std::string rank = e.path().filename().string();
    for (const char* f : {"model.safetensors", "optim.safetensors"}) {
      auto [c, o] = Sh("cmp " + m.dir() + "/model/" + rank + "/" + f + " " + (e.path() / f).string());
      EXPECT_EQ(c, 0) << o;
    }
  }
  // The covering (generation 2) wrote no shard file.
  EXPECT_FALSE(fs::exists(tmp_ / "store/gen-000002/worker-00"));
  auto [c, o] = Ptcfs("verify " + tmp_ / "store");
  EXPECT_EQ(c, 0) << o;
}

}  // namespace
}  // namespace ptc
