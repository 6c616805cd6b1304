// The store end to end on the real filesystem: write, commit, reopen, read back
// bit-exact, verify, cross-check with h5py, every I/O failure point of a
// commit, corruption, open errors and garbage collection.
#include "ptc/store/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "ptc/base/fault_injection_env.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/h5shard.h"
#include "ptc/store/shard_verify.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ShardSpec {
  std::string tensor;
  std::vector<Box> boxes;
  int worker;
};

GenerationManifest Meta() {
  GenerationManifest m;
  m.schema = json::parse(R"({"name": "test", "rules": []})");
  m.dims = "layers=1,hidden=8";
  m.config = "tp=2,pp=1,dp=1";
  m.tensors = {
      {"layers.0.attn.w", DType::kF32, {4, 8}},
      {"embedding", DType::kBF16, {16, 4}},
      {"fp8.a", DType::kF8E4M3, {10}},
      {"fp8.b", DType::kF8E5M2, {3, 3}},
      {"mask", DType::kBool, {5, 2}},
      {"half", DType::kF16, {6}},
      {"dbl", DType::kF64, {2, 2}},
      {"i64", DType::kI64, {3}},
      {"i32", DType::kI32, {2, 2}},
      {"i16", DType::kI16, {4}},
      {"i8", DType::kI8, {4}},
      {"u8", DType::kU8, {4}},
      {"odd name with spaces", DType::kF32, {2}},
      {"empty", DType::kF32, {0, 3}},
      {"scalar", DType::kF32, {}},
      {"big", DType::kF32, {2 * 1048576 + 25}},
  };
  m.extra = {{"dataset", {{"epoch", 0}}}};
  return m;
}

std::vector<ShardSpec> Gen1Specs() {
  std::vector<ShardSpec> specs = {
      {"layers.0.attn.w", {Box{{0, 0}, {2, 8}}}, 0},
      {"layers.0.attn.w", {Box{{2, 0}, {4, 8}}}, 1},
      {"layers.0.attn.w", {Box{{0, 0}, {2, 8}}}, 1},  // replica on worker 1
      {"embedding", {Box{{0, 0}, {4, 4}}, Box{{8, 0}, {12, 4}}}, 0},
      {"embedding", {Box{{4, 0}, {8, 4}}, Box{{12, 0}, {16, 4}}}, 1},
      {"odd name with spaces", {Box{{0}, {1}}}, 0},
      {"odd name with spaces", {Box{{1}, {2}}}, 0},
      {"empty", {Box{{0, 0}, {0, 3}}}, 0},
  };
  for (const char* name : {"fp8.a", "fp8.b", "mask", "half", "dbl", "i64", "i32", "i16", "i8", "u8", "scalar"}) {
    specs.push_back({name, {Box::Full(FindTensor(Meta(), name)->shape)}, 0});
  }
  return specs;
}

uint64_t NBytes(const GenerationManifest& m, const ShardSpec& s) {
  uint64_t n = 0;
  for (const Box& b : s.boxes) n += static_cast<uint64_t>(b.volume());
  return n * DTypeSize(FindTensor(m, s.tensor)->dtype);
}

std::string Bytes(uint64_t n, uint64_t salt) {
  std::mt19937_64 rng(salt);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// Writes the shards of `specs` (bytes from Bytes(n, salt + i)) in chunks of `chunk`.
Status WriteShards(GenerationWriter& w, const std::vector<ShardSpec>& specs, uint64_t salt, size_t chunk,
                   std::vector<ShardRecord>* records = nullptr) {
  const GenerationManifest meta = Meta();
  for (size_t i = 0; i < specs.size(); ++i) {
    const ShardSpec& s = specs[i];
    const std::string data = Bytes(NBytes(meta, s), salt + i);
    PTC_ASSIGN_OR_RETURN(auto sink, w.NewShard(s.tensor, FindTensor(meta, s.tensor)->dtype, s.boxes, s.worker));
    for (size_t pos = 0; pos < data.size(); pos += chunk) {
      PTC_RETURN_IF_ERROR(sink->Append(data.data() + pos, std::min(chunk, data.size() - pos)));
    }
    PTC_ASSIGN_OR_RETURN(ShardRecord r, sink->Finish());
    if (records) records->push_back(r);
    w.AddShard(std::move(r));
  }
  return Status::OK();
}

Status CommitGen1(Store& store) {
  PTC_ASSIGN_OR_RETURN(auto w, store.BeginGeneration());
  PTC_RETURN_IF_ERROR(WriteShards(*w, Gen1Specs(), 100, 7));
  return w->Commit(Meta());
}

// Rewrites the w shards and references everything else from the current generation.
Status CommitGen2(Store& store) {
  PTC_ASSIGN_OR_RETURN(auto w, store.BeginGeneration());
  std::vector<ShardSpec> specs = {{"layers.0.attn.w", {Box{{0, 0}, {4, 8}}}, 0},
                                  {"embedding", {Box{{0, 0}, {16, 4}}}, 1}};
  PTC_RETURN_IF_ERROR(WriteShards(*w, specs, 200, 64));
  for (const ShardRecord& s : store.current().shards) {
    if (s.tensor != "layers.0.attn.w" && s.tensor != "embedding") w->AddShard(s);
  }
  GenerationManifest meta = Meta();
  meta.extra["dataset"]["epoch"] = 1;
  return w->Commit(meta);
}

std::map<std::string, std::string> SnapshotFiles(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out[fs::relative(e.path(), root).string()] = ss.str();
  }
  return out;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ptcfs_store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/store";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Store> CreateWithGen1(Env* env = Env::Default()) {
    auto store = Store::Create(env, root_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    Status s = CommitGen1(**store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::move(store).value();
  }

  std::string dir_, root_;
};

TEST(Sanitize, FileNames) {
  EXPECT_EQ(SanitizeFileName("layers.0.w-b_c"), "layers.0.w-b_c");
  EXPECT_EQ(SanitizeFileName("a/b c\xff"), "a_b_c_");
  EXPECT_EQ(SanitizeFileName(""), "_");
  EXPECT_EQ(SanitizeFileName(std::string(300, 'x')).size(), 200u);
}

TEST_F(StoreTest, CreateWriteCommitReopenReadBack) {
  auto created = Store::Create(Env::Default(), root_);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_FALSE((*created)->has_generation());
  EXPECT_EQ(ReadFileToString(Env::Default(), root_ + "/manifest.json").value(),
            "{\"format\":\"ptcfs-store\",\"version\":1,\"generation\":0}\n");
  ASSERT_TRUE(CommitGen1(**created).ok());
  EXPECT_EQ((*created)->current_generation(), 1u);

  auto store = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const GenerationManifest& m = (*store)->current();
  EXPECT_EQ(m, (*created)->current());
  EXPECT_EQ(m.generation, 1u);
  EXPECT_FALSE(m.parent.has_value());
  EXPECT_EQ(m.dims, Meta().dims);
  EXPECT_EQ(m.extra, Meta().extra);
  ASSERT_EQ(m.shards.size(), Gen1Specs().size());
  EXPECT_EQ(m.shards[0].file, "gen-000001/worker-00/layers.0.attn.w.s0.h5");
  EXPECT_EQ(m.shards[2].file, "gen-000001/worker-01/layers.0.attn.w.s1.h5");
  EXPECT_EQ(m.shards[6].file, "gen-000001/worker-00/odd_name_with_spaces.s1.h5");
  const std::vector<ShardSpec> specs = Gen1Specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    EXPECT_EQ(s.boxes, specs[i].boxes);
    EXPECT_EQ(s.worker, specs[i].worker);
    const std::string expect = Bytes(NBytes(m, specs[i]), 100 + i);
    std::string got(s.nbytes, '\0');
    ASSERT_TRUE(ReadShardBytes(Env::Default(), **store, s, 0, got.size(), got.data()).ok());
    EXPECT_EQ(got, expect) << s.tensor;
    EXPECT_EQ(s.checksum, Xxh64(expect.data(), expect.size()));
    if (s.nbytes > 3) {
      char part[2];
      ASSERT_TRUE(ReadShardBytes(Env::Default(), **store, s, 2, 2, part).ok());
      EXPECT_EQ(std::string(part, 2), expect.substr(2, 2));
    }
    EXPECT_EQ(ReadShardBytes(Env::Default(), **store, s, s.nbytes, 1, nullptr).code(), Code::kInvalidArgument);
  }
  Status v = VerifyGeneration(**store, m);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_F(StoreTest, H5pyReadsTheShards) {
  if (std::system("/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null") != 0) {
    FAIL() << "h5py is missing: install python3-h5py (apt-get install -y python3-h5py python3-numpy)";
  }
  auto store = CreateWithGen1();
  const std::string script = dir_ + "/read.py", out = dir_ + "/out.json";
  std::ofstream(script) << R"(import sys, json, h5py
res = []
for p in sys.argv[2:]:
    with h5py.File(p, "r") as f:
        d = f["data"]
        attrs = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in d.attrs.items()}
        res.append({"dtype": d.dtype.str, "shape": list(d.shape), "attrs": attrs,
                    "hex": d[()].tobytes().hex(), "offset": d.id.get_offset() or 0})
json.dump(res, open(sys.argv[1], "w"))
)";
  const GenerationManifest& m = store->current();
  std::string cmd = "/usr/bin/python3 " + script + " " + out;
  for (const ShardRecord& s : m.shards) cmd += " '" + store->AbsPath(s.file) + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  json res = json::parse(*ReadFileToString(Env::Default(), out));
  const std::map<DType, std::string> kNumpy = {{DType::kF64, "<f8"},  {DType::kF32, "<f4"},    {DType::kF16, "<f2"},
                                               {DType::kBF16, "<u2"}, {DType::kI64, "<i8"},    {DType::kI32, "<i4"},
                                               {DType::kI16, "<i2"},  {DType::kI8, "|i1"},     {DType::kU8, "|u1"},
                                               {DType::kBool, "|u1"}, {DType::kF8E4M3, "|u1"}, {DType::kF8E5M2, "|u1"}};
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    const TensorRecord& t = *FindTensor(m, s.tensor);
    const json& r = res[i];
    std::string bytes(s.nbytes, '\0');
    ASSERT_TRUE(ReadShardBytes(Env::Default(), *store, s, 0, bytes.size(), bytes.data()).ok());
    std::string hex;
    for (unsigned char c : bytes) hex += "0123456789abcdef"[c >> 4], hex += "0123456789abcdef"[c & 15];
    EXPECT_EQ(r["hex"], hex) << s.file;
    EXPECT_EQ(r["dtype"], kNumpy.at(t.dtype)) << s.file;
    EXPECT_EQ(r["attrs"]["tensor"], s.tensor);
    EXPECT_EQ(r["attrs"]["dtype"], DTypeName(t.dtype));
    EXPECT_EQ(json::parse(r["attrs"]["boxes"].get<std::string>()), BoxesToJson(s.boxes));
    if (s.nbytes > 0) {
      EXPECT_EQ(r["offset"], s.offset);
    }
    json shape = s.boxes.size() == 1 ? json(s.boxes[0].shape()) : json::array({s.nbytes / DTypeSize(t.dtype)});
    EXPECT_EQ(r["shape"], shape) << s.file;
  }
}

TEST_F(StoreTest, SecondGenerationReferencesOlderFiles) {
  auto store = CreateWithGen1();
  ASSERT_TRUE(CommitGen2(*store).ok());
  auto reopened = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(reopened.ok());
  const GenerationManifest& m = (*reopened)->current();
  EXPECT_EQ(m.generation, 2u);
  EXPECT_EQ(m.parent, std::optional<uint64_t>(1));
  EXPECT_EQ(m.extra["dataset"]["epoch"], 1);
  EXPECT_EQ(m.shards[0].file, "gen-000002/worker-00/layers.0.attn.w.s0.h5");
  EXPECT_EQ(m.shards.back().file.substr(0, 11), "gen-000001/");
  EXPECT_TRUE(VerifyGeneration(**reopened, m).ok());
  auto g1 = (*reopened)->LoadGeneration(1);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(g1->shards.size(), Gen1Specs().size());
  EXPECT_EQ((*reopened)->LoadGeneration(5).status().code(), Code::kNotFound);
}

// For every mutating op n of a second commit, on a fresh store with generation
// 1: fail op n (and, unless `once`, every op after it); check that generation 1
// is current and byte-identical; disarm and check that a retry commits.
// Ends at the first n where the commit needs no more than n ops.
void RunFaultLoop(const std::string& dir, bool once, bool only_rename_sync) {
  int n = 0;
  for (;; ++n) {
    ASSERT_LT(n, 2000);
    const std::string root = dir + "/store" + std::to_string(n);
    FaultInjectionEnv fenv(Env::Default());
    auto store = Store::Create(&fenv, root);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(CommitGen1(**store).ok());
    const GenerationManifest gen1 = (*store)->current();
    const auto before = SnapshotFiles(root);
    fenv.SetOnlyRenameAndSync(only_rename_sync);
    if (once)
      fenv.FailOnceAfter(n);
    else
      fenv.FailAfter(n);
    Status s = CommitGen2(**store);
    fenv.Disarm();
    if (s.ok()) break;
    SCOPED_TRACE("failed op " + std::to_string(n) + ": " + s.ToString());
    ASSERT_NE(s.message().find("injected fault"), std::string::npos);
    if (s.message().find("committed but not durable") != std::string::npos) {
      // Only the fsync after the commit point failed: the new generation is visible.
      EXPECT_EQ((*store)->current_generation(), 2u);
      EXPECT_EQ(Store::Open(Env::Default(), root).value()->current_generation(), 2u);
      continue;
    }
    EXPECT_EQ((*store)->current_generation(), 1u);
    auto reopened = Store::Open(Env::Default(), root);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_EQ((*reopened)->current(), gen1);
    for (const auto& [rel, bytes] : before) {
      EXPECT_EQ(ReadFileToString(Env::Default(), JoinPath(root, rel)).value(), bytes) << rel;
    }
    Status v = VerifyGeneration(**reopened, (*reopened)->current());
    EXPECT_TRUE(v.ok()) << v.ToString();
    if (once) {
      EXPECT_FALSE(fs::exists(root + "/gen-000002"));
    }
    // The retry, through the same Store object, after the failure.
    Status retry = CommitGen2(**store);
    ASSERT_TRUE(retry.ok()) << retry.ToString();
    auto after = Store::Open(Env::Default(), root);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ((*after)->current_generation(), 2u);
    EXPECT_TRUE(VerifyGeneration(**after, (*after)->current()).ok());
    fs::remove_all(root);
  }
  std::printf("commit survived failures at ops 0..%d (%s%s)\n", n - 1, once ? "once" : "sticky",
              only_rename_sync ? ", rename/sync only" : "");
  EXPECT_GT(n, only_rename_sync ? 5 : 15);
}

TEST_F(StoreTest, EveryFailurePointKeepsThePreviousGeneration) { RunFaultLoop(dir_, false, false); }
TEST_F(StoreTest, EverySingleFailureIsCleanedUp) { RunFaultLoop(dir_, true, false); }
TEST_F(StoreTest, RenameAndSyncFailuresOnly) { RunFaultLoop(dir_, false, true); }

TEST_F(StoreTest, CorruptByteIsDetected) {
  auto store = CreateWithGen1();
  const ShardRecord& s = store->current().shards[3];  // embedding, two boxes
  {
    auto f = Env::Default()->OpenExisting(store->AbsPath(s.file));
    ASSERT_TRUE(f.ok());
    char c;
    ASSERT_TRUE(ReadShardBytes(Env::Default(), *store, s, 5, 1, &c).ok());
    c ^= 1;
    ASSERT_TRUE((*f)->PWrite(s.offset + 5, &c, 1).ok());
  }
  Status v = VerifyShard(Env::Default(), *store, s);
  EXPECT_EQ(v.code(), Code::kCorruption);
  EXPECT_NE(v.message().find("tensor 'embedding' boxes [0:4, 0:4] [8:12, 0:4] in gen-000001/worker-00/embedding.s0.h5"),
            std::string::npos)
      << v.message();
  EXPECT_EQ(VerifyGeneration(*store, store->current()).code(), Code::kCorruption);

  ShardRecord wrong = store->current().shards[0];
  wrong.offset += 1;
  Status h = CheckH5Shard(store->AbsPath(wrong.file), wrong, DType::kF32);
  EXPECT_EQ(h.code(), Code::kCorruption);
  EXPECT_NE(h.message().find("offset"), std::string::npos) << h.message();
  wrong = store->current().shards[0];
  wrong.tensor = "other";
  EXPECT_NE(CheckH5Shard(store->AbsPath(wrong.file), wrong, DType::kF32).message().find("attribute 'tensor'"),
            std::string::npos);
  EXPECT_EQ(CheckH5Shard(store->AbsPath("nope.h5"), wrong, DType::kF32).code(), Code::kNotFound);
  std::ofstream(dir_ + "/not.h5") << "not hdf5";
  Status not_h5 = CheckH5Shard(dir_ + "/not.h5", wrong, DType::kF32);
  EXPECT_EQ(not_h5.code(), Code::kCorruption);
  EXPECT_EQ(not_h5.message().rfind(dir_ + "/not.h5: HDF5 H5Fopen failed: ", 0), 0u) << not_h5.message();
  std::printf("%s\n", not_h5.ToString().c_str());
  auto exists = CreateH5Shard(dir_ + "/not.h5", DType::kF32, {Box{{0}, {1}}}, "t");
  EXPECT_EQ(exists.status().code(), Code::kAlreadyExists);
  auto no_dir = CreateH5Shard(dir_ + "/nodir/x.h5", DType::kF32, {Box{{0}, {1}}}, "t");
  EXPECT_EQ(no_dir.status().code(), Code::kIOError);
  std::printf("%s\n", no_dir.status().ToString().c_str());
  // Errors are reported, not printed, on other threads too.
  std::thread([&] { EXPECT_FALSE(CheckH5Shard(dir_ + "/not.h5", wrong, DType::kF32).ok()); }).join();

  fs::resize_file(store->AbsPath(s.file), s.offset + 3);
  v = VerifyShard(Env::Default(), *store, s);
  EXPECT_EQ(v.code(), Code::kCorruption);
  EXPECT_NE(v.message().find("tensor 'embedding'"), std::string::npos) << v.message();
}

TEST_F(StoreTest, OpenErrorsAreClear) {
  auto missing = Store::Open(Env::Default(), root_);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().message().rfind(root_ + "/manifest.json: no ptcfs store here", 0), 0u)
      << missing.status().message();

  fs::create_directories(root_);
  std::ofstream(root_ + "/manifest.json") << "garbage{";
  auto garbage = Store::Open(Env::Default(), root_);
  EXPECT_EQ(garbage.status().code(), Code::kCorruption);
  EXPECT_EQ(garbage.status().message().rfind(root_ + "/manifest.json: ", 0), 0u) << garbage.status().message();

  std::ofstream(root_ + "/manifest.json") << R"({"format":"ptcfs-store","version":1,"generation":9})";
  auto dangling = Store::Open(Env::Default(), root_);
  EXPECT_EQ(dangling.status().code(), Code::kCorruption);
  EXPECT_NE(dangling.status().message().find("names generation 9"), std::string::npos);
  EXPECT_NE(dangling.status().message().find("gen-000009/manifest.json"), std::string::npos)
      << dangling.status().message();

  fs::create_directories(root_ + "/gen-000009");
  std::ofstream(root_ + "/gen-000009/manifest.json") << "{}";
  auto bad_gen = Store::Open(Env::Default(), root_);
  EXPECT_NE(bad_gen.status().message().find("gen-000009/manifest.json: \"format\" is missing"), std::string::npos)
      << bad_gen.status().message();

  EXPECT_EQ(Store::Create(Env::Default(), root_).status().code(), Code::kAlreadyExists);
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_EQ(Store::Create(Env::Default(), dir_ + "/file").status().code(), Code::kAlreadyExists);
  fs::create_directories(dir_ + "/emptydir");
  EXPECT_TRUE(Store::Create(Env::Default(), dir_ + "/emptydir").ok());
}

// A worker bringing its store to its job's generation writes that number,
// keeping what it wrote there for the job before the commit was missed.
TEST_F(StoreTest, BeginGenerationAtNumbersItAndKeepsItsDirectory) {
  {
    auto store = Store::Create(Env::Default(), root_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(CommitGen1(**store).ok());
  }
  const std::string part = root_ + "/gen-000005/worker-01/part.h5";
  fs::create_directories(root_ + "/gen-000005/worker-01");
  testing::Spit(part, "written before the commit was missed");
  testing::Spit(root_ + "/gen-000005/" + std::string(kUncommittedMarker), "");
  fs::create_directories(root_ + "/gen-000003");  // a leftover between: removed
  auto store = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->BeginGenerationAt(1).status().code(), Code::kFailedPrecondition);  // not above the current
  auto w = (*store)->BeginGenerationAt(5);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->generation(), 5u);
  EXPECT_TRUE(fs::exists(part));
  EXPECT_FALSE(fs::exists(root_ + "/gen-000003"));
  for (const ShardRecord& r : (*store)->current().shards) (*w)->AddShard(r);
  ASSERT_TRUE((*w)->Commit(Meta()).ok());
  EXPECT_EQ((*store)->current_generation(), 5u);
  EXPECT_TRUE(fs::exists(part));
  EXPECT_FALSE(fs::exists(root_ + "/gen-000005/" + std::string(kUncommittedMarker)));
  w->reset();
  // A directory above the number asked for: refused, nothing removed.
  fs::create_directories(root_ + "/gen-000009");
  testing::Spit(root_ + "/gen-000009/manifest.json", "{}");
  auto above = (*store)->BeginGenerationAt(7);
  EXPECT_EQ(above.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(above.status().message().find("cannot write generation 7 here (current 5, next free 10)"),
            std::string::npos)
      << above.status().ToString();
  EXPECT_TRUE(fs::exists(root_ + "/gen-000009/manifest.json"));
}

TEST_F(StoreTest, LeftoverGenerationIsIgnoredThenRemoved) {
  auto store = CreateWithGen1();
  fs::create_directories(root_ + "/gen-000002/worker-00");
  std::ofstream(root_ + "/gen-000002/worker-00/junk.h5") << "junk";
  fs::create_directories(root_ + "/gen-000007");
  auto reopened = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->current_generation(), 1u);
  ASSERT_TRUE(CommitGen2(**reopened).ok());
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002/worker-00/junk.h5"));
  EXPECT_FALSE(fs::exists(root_ + "/gen-000007"));
}

// A save's staged file adopted whole (GenerationWriter::AdoptFile): the
// shard's record points into it (no byte copied; an HDF5 file describes the
// bytes there, as for rank files), the staged file keeps its own name, and an
// uncommitted generation takes only its own link away.
TEST_F(StoreTest, AnAdoptedFileHoldsItsShardsInPlace) {
  auto store = CreateWithGen1();
  const ShardRecord first = store->current().shards[0];  // layers.0.attn.w rows 0-1 on worker 0
  std::string bytes(first.nbytes, '\0');
  ASSERT_TRUE(ReadShardBytes(Env::Default(), *store, first, 0, bytes.size(), bytes.data()).ok());
  const std::string staged = dir_ + "/staged.pt", name = "mp_rank_00.model_optim_rng.pt";
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), staged, "HEADER--" + bytes + "TRAILER").ok());
  const std::string linked = root_ + "/gen-000002/worker-00/" + name;
  {
    auto w = store->BeginGeneration();
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AdoptFile(staged, 0, name).ok());
    EXPECT_TRUE(fs::exists(linked));
    EXPECT_EQ((*w)->AdoptFile(staged, 0, name).code(), Code::kInvalidArgument);  // taken
    EXPECT_EQ((*w)->AdoptFile(staged, 0, "x.s0.h5").code(), Code::kInvalidArgument);
    EXPECT_EQ((*w)->AdoptFile(staged, 0, "../x").code(), Code::kInvalidArgument);
    EXPECT_EQ((*w)->AdoptFile(dir_ + "/absent", 0, "absent.pt").code(), Code::kNotFound);
    EXPECT_EQ((*w)->NewShardIn(first.tensor, DType::kF32, first.boxes, 1, name, 8).status().code(),
              Code::kFailedPrecondition);  // adopted for worker 0 only
    auto past = (*w)->NewShardIn(first.tensor, DType::kF32, first.boxes, 0, name, 8 + bytes.size());
    EXPECT_EQ(past.status().code(), Code::kInvalidArgument);
    EXPECT_NE(past.status().message().find("past its end"), std::string::npos) << past.status().ToString();
  }
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002"));
  EXPECT_TRUE(fs::exists(staged));

  auto w = store->BeginGeneration();
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AdoptFile(staged, 0, name).ok());
  for (size_t i = 0; i < store->current().shards.size(); ++i) {
    if (i != 0) {
      (*w)->AddShard(store->current().shards[i]);
      continue;
    }
    auto sink = (*w)->NewShardIn(first.tensor, DType::kF32, first.boxes, 0, name, 8);
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    ASSERT_TRUE((*sink)->Append(bytes.data(), bytes.size()).ok());
    auto record = (*sink)->Finish();
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    (*w)->AddShard(*record);
  }
  ASSERT_TRUE((*w)->Commit(Meta()).ok());
  fs::remove(staged);  // a save's staged names go once it is committed

  auto reopened = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  const ShardRecord& r = (*reopened)->current().shards[0];
  EXPECT_EQ(r.file, "gen-000002/worker-00/" + name);
  EXPECT_EQ(r.offset, 8u);
  EXPECT_EQ(r.h5, "gen-000002/worker-00/layers.0.attn.w.s0.h5");
  EXPECT_EQ(r.checksum, first.checksum);
  EXPECT_EQ(fs::file_size(linked), 8 + bytes.size() + 7);  // the staged file itself, nothing added
  std::string got(r.nbytes, '\0');
  ASSERT_TRUE(ReadShardBytes(Env::Default(), **reopened, r, 0, got.size(), got.data()).ok());
  EXPECT_EQ(got, bytes);
  const Status v = VerifyGeneration(**reopened, (*reopened)->current());
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_F(StoreTest, WriterRules) {
  auto store = CreateWithGen1();
  auto w = store->BeginGeneration();
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->generation(), 2u);
  EXPECT_EQ(store->BeginGeneration().status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(store->CollectGarbage().code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->NewShard("x", DType::kF32, {Box{{0}, {1}}}, -1).status().code(), Code::kInvalidArgument);

  auto sink = (*w)->NewShard("layers.0.attn.w", DType::kF32, {Box{{0, 0}, {1, 2}}}, 0);
  ASSERT_TRUE(sink.ok());
  EXPECT_EQ((*sink)->Finish().status().code(), Code::kFailedPrecondition);  // nothing written yet
  EXPECT_EQ((*sink)->Append("123456789", 9).code(), Code::kInvalidArgument);
  ASSERT_TRUE((*sink)->Append("12345678", 8).ok());
  auto rec = (*sink)->Finish();
  ASSERT_TRUE(rec.ok());
  ShardRecord bad = *rec;
  bad.nbytes = 4;
  (*w)->AddShard(bad);
  Status s = (*w)->Commit(Meta());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'layers.0.attn.w'"), std::string::npos) << s.message();
  EXPECT_EQ((*w)->Commit(Meta()).code(), Code::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002"));
  EXPECT_EQ(store->current_generation(), 1u);
  w->reset();
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002"));

  // A verbatim copy takes its source's checksums: the same record as hashing
  // the same bytes gives, and only before the first byte, for the same size.
  {
    auto wv = store->BeginGeneration();
    ASSERT_TRUE(wv.ok());
    auto hashed = (*wv)->NewShard("layers.0.attn.w", DType::kF32, {Box{{0, 0}, {1, 2}}}, 0);
    auto copied = (*wv)->NewShard("layers.0.attn.w", DType::kF32, {Box{{0, 0}, {1, 2}}}, 1);
    ASSERT_TRUE(hashed.ok() && copied.ok());
    ASSERT_TRUE((*hashed)->Append("abcdefgh", 8).ok());
    auto source = (*hashed)->Finish();
    ASSERT_TRUE(source.ok());
    ShardRecord other_size = *source;
    other_size.nbytes = 16;
    EXPECT_EQ((*copied)->AdoptChecksums(other_size).code(), Code::kFailedPrecondition);
    ASSERT_TRUE((*copied)->AdoptChecksums(*source).ok());
    ASSERT_TRUE((*copied)->Append("abcd", 4).ok());
    EXPECT_EQ((*copied)->AdoptChecksums(*source).code(), Code::kFailedPrecondition);
    ASSERT_TRUE((*copied)->Append("efgh", 4).ok());
    auto copy = (*copied)->Finish();
    ASSERT_TRUE(copy.ok());
    EXPECT_EQ(copy->checksum, source->checksum);
    EXPECT_EQ(copy->checksum, Xxh64("abcdefgh", 8));
  }

  // A referenced file that does not exist.
  auto w2 = store->BeginGeneration();
  ASSERT_TRUE(w2.ok());
  ShardRecord ghost = store->current().shards[0];
  ghost.file = "gen-000001/worker-00/ghost.h5";
  (*w2)->AddShard(ghost);
  EXPECT_EQ((*w2)->Commit(Meta()).code(), Code::kNotFound);
  w2->reset();

  // An abandoned writer removes its directory.
  {
    auto w3 = store->BeginGeneration();
    ASSERT_TRUE(w3.ok());
    ASSERT_TRUE(WriteShards(**w3, Gen1Specs(), 1, 100).ok());
    EXPECT_TRUE(fs::exists(root_ + "/gen-000002/worker-01"));
  }
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002"));
  EXPECT_EQ(Store::Open(Env::Default(), root_).value()->current_generation(), 1u);
}

// A shard of three checksum blocks: each block is checked on its own, so a
// corrupt block fails the reads that need it and no others.
TEST_F(StoreTest, BlockChecksumsVerifyWhatIsRead) {
  auto store = Store::Create(Env::Default(), root_);
  ASSERT_TRUE(store.ok());
  auto w = (*store)->BeginGeneration();
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(WriteShards(**w, {{"big", {Box::Full({2 * 1048576 + 25})}, 0}}, 7, 1 << 20).ok());
  ASSERT_TRUE((*w)->Commit(Meta()).ok());
  const ShardRecord s = (*store)->current().shards[0];
  const std::string data = Bytes(s.nbytes, 7);
  ASSERT_EQ(s.block_checksums.size(), 3u);
  EXPECT_EQ(s.block_checksums[1], Xxh64(data.data() + kChecksumBlockBytes, kChecksumBlockBytes));
  EXPECT_EQ(s.block_checksums[2], Xxh64(data.data() + 2 * kChecksumBlockBytes, 100));
  EXPECT_EQ(s.checksum, CombineBlockChecksums(s.block_checksums));
  EXPECT_EQ(BlockOf(s, kChecksumBlockBytes - 1), 0u);
  EXPECT_EQ(BlockOf(s, kChecksumBlockBytes), 1u);
  EXPECT_EQ(BlockEnd(s, 2), s.nbytes);
  auto reopened = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->current().shards[0], s);
  EXPECT_TRUE(VerifyShard(Env::Default(), **store, s).ok());

  // One flipped byte in block 1.
  const uint64_t bad = kChecksumBlockBytes + 4000;
  {
    auto f = Env::Default()->OpenExisting((*store)->AbsPath(s.file));
    ASSERT_TRUE(f.ok());
    const char c = static_cast<char>(data[bad] ^ 0x40);
    ASSERT_TRUE((*f)->PWrite(s.offset + bad, &c, 1).ok());
  }
  Env* env = Env::Default();
  EXPECT_TRUE(VerifyShardRange(env, **store, s, 0, kChecksumBlockBytes).ok());
  EXPECT_TRUE(VerifyShardRange(env, **store, s, 2 * kChecksumBlockBytes + 3, 1).ok());
  EXPECT_TRUE(VerifyShardRange(env, **store, s, 5, 0).ok());
  for (auto [at, n] : {std::pair<uint64_t, uint64_t>{bad, 1}, {kChecksumBlockBytes - 1, 2}, {0, s.nbytes}}) {
    Status v = VerifyShardRange(env, **store, s, at, n);
    EXPECT_EQ(v.code(), Code::kCorruption) << at;
    EXPECT_NE(v.message().find("tensor 'big' boxes [0:2097177] in gen-000001/worker-00/big.s0.h5: checksum of "
                               "block 1 (bytes 4194304-8388608) xxh64:"),
              std::string::npos)
        << v.message();
  }
  EXPECT_EQ(VerifyShardRange(env, **store, s, s.nbytes - 1, 2).code(), Code::kInvalidArgument);

  // The same in an open file: mapped (a descriptor), and read (none), and short.
  auto opened = env->OpenRead((*store)->AbsPath(s.file));
  ASSERT_TRUE(opened.ok());
  struct NoDescriptor : RandomAccessFile {
    const RandomAccessFile& f;
    uint64_t size;
    NoDescriptor(const RandomAccessFile& f, uint64_t size) : f(f), size(size) {}
    Status Read(uint64_t o, size_t n, void* d) const override {
      if (o + n > size) return CorruptionError(f.path() + ": short");
      return f.Read(o, n, d);
    }
    uint64_t Size() const override { return size; }
    const std::string& path() const override { return f.path(); }
  };
  const NoDescriptor unmapped(**opened, (*opened)->Size()), short_file(**opened, s.offset + kChecksumBlockBytes + 10);
  const std::vector<const RandomAccessFile*> files = {opened->get(), &unmapped};
  for (const RandomAccessFile* file : files) {
    EXPECT_TRUE(VerifyShardRangeInFile(*file, s, 0, kChecksumBlockBytes).ok());
    EXPECT_TRUE(VerifyShardRangeInFile(*file, s, 2 * kChecksumBlockBytes + 3, 1).ok());
    for (auto [at, n] : {std::pair<uint64_t, uint64_t>{bad, 1}, {kChecksumBlockBytes - 1, 2}, {0, s.nbytes}}) {
      Status v = VerifyShardRangeInFile(*file, s, at, n);
      EXPECT_EQ(v.code(), Code::kCorruption) << at;
      EXPECT_NE(v.message().find("checksum of block 1 (bytes 4194304-8388608)"), std::string::npos) << v.message();
    }
    EXPECT_EQ(VerifyShardRangeInFile(*file, s, s.nbytes - 1, 2).code(), Code::kInvalidArgument);
  }
  EXPECT_TRUE(VerifyShardRangeInFile(short_file, s, 0, 1).ok());
  Status cut = VerifyShardRangeInFile(short_file, s, 2 * kChecksumBlockBytes, 1);
  EXPECT_EQ(cut.code(), Code::kCorruption);
  EXPECT_NE(cut.message().find("tensor 'big'"), std::string::npos) << cut.message();

  // A reader from block 2 checks it alone; a reader from block 0 fails when it completes block 1.
  auto from2 = VerifyingShardReader::Open(env, **store, s, 2);
  ASSERT_TRUE(from2.ok());
  EXPECT_EQ((*from2)->position(), 2 * kChecksumBlockBytes);
  std::string buf(100, '\0');
  ASSERT_TRUE((*from2)->Read(100, buf.data()).ok());
  EXPECT_EQ(buf, data.substr(2 * kChecksumBlockBytes));
  EXPECT_TRUE((*from2)->Finish().ok());
  EXPECT_EQ(VerifyingShardReader::Open(env, **store, s, 3).status().code(), Code::kInvalidArgument);
  auto from0 = VerifyingShardReader::Open(env, **store, s);
  ASSERT_TRUE(from0.ok());
  std::string scratch(kChecksumBlockBytes, '\0');
  EXPECT_TRUE((*from0)->Next(kChecksumBlockBytes, scratch.data()).ok());
  EXPECT_TRUE((*from0)->Next(bad - kChecksumBlockBytes + 1, scratch.data()).ok());  // block 1 not yet complete
  EXPECT_EQ((*from0)->Next(2 * kChecksumBlockBytes - bad - 1, scratch.data()).status().code(), Code::kCorruption);
}

TEST_F(StoreTest, GarbageCollectionKeepsReferencedFiles) {
  auto store = CreateWithGen1();
  ASSERT_TRUE(CommitGen2(*store).ok());
  ASSERT_TRUE(store->CollectGarbage().ok());
  EXPECT_FALSE(fs::exists(root_ + "/gen-000001/manifest.json"));
  EXPECT_FALSE(fs::exists(root_ + "/gen-000001/worker-00/layers.0.attn.w.s0.h5"));  // rewritten in gen 2
  EXPECT_FALSE(fs::exists(root_ + "/gen-000001/worker-01"));                        // only w and embedding lived there
  EXPECT_TRUE(fs::exists(root_ + "/gen-000001/worker-00/mask.s0.h5"));
  EXPECT_TRUE(VerifyGeneration(*store, store->current()).ok());
  EXPECT_EQ(store->LoadGeneration(1).status().code(), Code::kNotFound);
  auto reopened = Store::Open(Env::Default(), root_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_TRUE(VerifyGeneration(**reopened, (*reopened)->current()).ok());

  // Generation 3 rewrites everything; keeping 2 keeps what 2 needs.
  auto w = store->BeginGeneration();
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(WriteShards(**w, Gen1Specs(), 300, 50).ok());
  ASSERT_TRUE((*w)->Commit(Meta()).ok());
  w->reset();
  ASSERT_TRUE(store->CollectGarbage({2}).ok());
  auto g2 = store->LoadGeneration(2);
  ASSERT_TRUE(g2.ok());
  EXPECT_TRUE(VerifyGeneration(*store, *g2).ok());
  EXPECT_TRUE(VerifyGeneration(*store, store->current()).ok());
  ASSERT_TRUE(store->CollectGarbage().ok());
  EXPECT_FALSE(fs::exists(root_ + "/gen-000001"));
  EXPECT_FALSE(fs::exists(root_ + "/gen-000002"));
  EXPECT_TRUE(VerifyGeneration(*store, store->current()).ok());
}

}  // namespace
}  // namespace ptc
