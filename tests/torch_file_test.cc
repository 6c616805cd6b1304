#include "ptc/format/torch_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "test_util.h"

namespace ptc {
namespace {

using pickle::Value;
using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kPython = "/usr/bin/python3";
const std::string kClient = kPython + " " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/torch_roundtrip.py";

void ExpectError(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok()) << "accepted, expected an error mentioning " << *parts.begin();
  for (const std::string& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << s.ToString();
}

// The specs of the storages of a file we read, and a reader of their bytes.
std::vector<TorchStorageSpec> Specs(const TorchFile& tf) {
  std::vector<TorchStorageSpec> specs;
  for (const TorchStorage& s : tf.storages) specs.push_back({s.key, s.dtype, s.numel, s.member.crc32});
  return specs;
}

TorchStorageReader ReaderOf(const RandomAccessFile& file, const TorchFile& tf) {
  return [&file, &tf](size_t storage, uint64_t offset, size_t n, void* dst) {
    return file.Read(tf.storages[storage].member.data_offset + offset, n, dst);
  };
}

// Only the storages the tensors under `root` use, in `tf`'s order.
std::vector<TorchStorageSpec> SpecsUsedBy(const TorchFile& tf, const Value& root, std::vector<size_t>* index) {
  std::set<std::string> used;
  pickle::ForEachTensor(root, [&](const std::string&, const pickle::Tensor& t) { used.insert(t.storage_key); });
  std::vector<TorchStorageSpec> specs;
  for (size_t i = 0; i < tf.storages.size(); ++i) {
    if (!used.count(tf.storages[i].key)) continue;
    specs.push_back({tf.storages[i].key, tf.storages[i].dtype, tf.storages[i].numel, 0});
    index->push_back(i);
  }
  return specs;
}

Status Write(const std::string& path, const std::string& archive, const Value& root,
             const std::vector<TorchStorageSpec>& specs, const TorchStorageReader& read) {
  PTC_ASSIGN_OR_RETURN(auto out, Env::Default()->OpenWrite(path));
  PTC_RETURN_IF_ERROR(WriteTorchFile(*out, archive, root, specs, read, path));
  return out->Close();
}

// One torch.save'd Megatron-like checkpoint shared by the tests of this suite.
class TorchSaved : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    auto [rc, out] = Sh(kClient + " torch-save " + dir_->path());
    ASSERT_EQ(rc, 0) << "needs /usr/bin/python3 with torch and numpy (apt-get install python3-torch): " << out;
    path_ = *dir_ / "model_optim_rng.pt";
  }
  static void TearDownTestSuite() { delete dir_; }

  static TempDir* dir_;
  static std::string path_;
};
TempDir* TorchSaved::dir_ = nullptr;
std::string TorchSaved::path_;

TEST_F(TorchSaved, ParsesAndGathersEveryTensor) {
  auto file = Env::Default()->OpenRead(path_);
  ASSERT_TRUE(file.ok());
  auto tf = ReadTorchFile(**file, path_);
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  EXPECT_EQ(tf->archive, "model_optim_rng");
  EXPECT_TRUE(VerifyTorchFileCrcs(**file, *tf, path_).ok());

  const Value& root = tf->root;
  EXPECT_EQ(*root.Find("iteration"), Value::Int(100));
  EXPECT_EQ(*root.Find("checkpoint_version"), Value::Float(3.0));
  const Value* args = root.Find("args");
  ASSERT_NE(args, nullptr);
  EXPECT_EQ(args->object().callable.FullName(), "argparse.Namespace");
  EXPECT_EQ(*args->GetAttr("tensor_model_parallel_size"), Value::Int(2));
  EXPECT_EQ(*args->GetAttr("params_dtype"), Value::FromGlobal(pickle::Global{"torch", "float16"}));
  const Value* emb = root.Find("model")->Find("language_model")->Find("embedding")->Find("word_embeddings");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->kind(), pickle::Kind::kOrderedDict);
  ASSERT_NE(emb->dict_state(), nullptr);
  EXPECT_NE(emb->dict_state()->Find("_metadata"), nullptr);
  EXPECT_EQ(emb->Find("weight")->tensor().dtype, DType::kF16);

  std::map<std::string, pickle::Tensor> tensors;
  pickle::ForEachTensor(root, [&](const std::string& path, const pickle::Tensor& t) { tensors[path] = t; });
  std::istringstream manifest(Slurp(*dir_ / "manifest.txt"));
  std::string path, dtype, shape, name;
  int count = 0, strided = 0;
  const std::map<std::string, DType> dtypes = {
      {"float32", DType::kF32}, {"float16", DType::kF16}, {"bfloat16", DType::kBF16}, {"float64", DType::kF64},
      {"int64", DType::kI64},   {"int32", DType::kI32},   {"int16", DType::kI16},     {"int8", DType::kI8},
      {"uint8", DType::kU8},    {"bool", DType::kBool}};
  while (manifest >> path >> dtype >> shape >> name) {
    SCOPED_TRACE(path);
    ++count;
    ASSERT_EQ(tensors.count(path), 1u);
    const pickle::Tensor& t = tensors[path];
    ASSERT_EQ(dtypes.count(dtype), 1u) << dtype;
    EXPECT_EQ(t.dtype, dtypes.at(dtype));
    std::string got_shape;
    for (int64_t d : t.shape) got_shape += (got_shape.empty() ? "" : ",") + std::to_string(d);
    EXPECT_EQ(got_shape.empty() ? "-" : got_shape, shape);
    if (!IsContiguous(t)) ++strided;
    auto bytes = ReadTensorBytes(**file, *tf, t, path_);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(*bytes, Slurp(*dir_ / name));
  }
  EXPECT_EQ(count, static_cast<int>(tensors.size()));
  EXPECT_GE(count, 25);
  EXPECT_GE(strided, 3);  // transposed, sliced, expanded
  // Views of one storage: "tied.a", "tied.b" and "row" share it.
  const Value* enc = root.Find("model")->Find("language_model")->Find("encoder");
  EXPECT_EQ(enc->Find("tied.a")->tensor().storage_key, enc->Find("row")->tensor().storage_key);
  EXPECT_EQ(enc->Find("row")->tensor().storage_offset, 8);
  EXPECT_TRUE(enc->Find("param")->tensor().parameter);
}

// Re-written from the parsed tree, the file loads in torch equal to the
// original, bit for bit; the lazily rendered layout equals the written file.
TEST_F(TorchSaved, RewriteLoadsEqualInTorch) {
  auto file = Env::Default()->OpenRead(path_);
  ASSERT_TRUE(file.ok());
  auto tf = ReadTorchFile(**file, path_);
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  const std::string out = *dir_ / "rewritten.pt";
  ASSERT_TRUE(Write(out, "model_optim_rng", tf->root, Specs(*tf), ReaderOf(**file, *tf)).ok());
  auto [rc, log] = Sh(kClient + " torch-same " + path_ + " " + out + " && " + kPython + " -m zipfile -t " + out);
  EXPECT_EQ(rc, 0) << log;

  // Read back by us: the same tree and bytes.
  auto file2 = Env::Default()->OpenRead(out);
  ASSERT_TRUE(file2.ok());
  auto tf2 = ReadTorchFile(**file2, out);
  ASSERT_TRUE(tf2.ok()) << tf2.status().ToString();
  EXPECT_EQ(tf2->root, tf->root);
  EXPECT_TRUE(VerifyTorchFileCrcs(**file2, *tf2, out).ok());
  ASSERT_EQ(tf2->storages.size(), tf->storages.size());
  EXPECT_EQ(tf2->zip.members.front().name, "model_optim_rng/data.pkl");
  EXPECT_EQ(tf2->zip.members[1].name, "model_optim_rng/byteorder");
  EXPECT_EQ(tf2->zip.members.back().name, "model_optim_rng/version");

  // The lazy path: plan, CRCs from the caller (here: the original members'),
  // layout, then any byte range.
  auto plan = PlanTorchFile("model_optim_rng", tf->root, Specs(*tf));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto layout = LayoutTorchFile(*plan);
  ASSERT_TRUE(layout.ok());
  const std::string written = Slurp(out);
  ASSERT_EQ(layout->size, written.size());
  auto reader = TorchMemberReader(*plan, ReaderOf(**file, *tf));
  std::mt19937_64 rng(TestSeed());
  for (int k = 0; k < 200; ++k) {
    const uint64_t off = rng() % written.size();
    const size_t n = rng() % std::min<uint64_t>(written.size() - off, 1 + rng() % 20000);
    std::string part(n, '\0');
    ASSERT_TRUE(ReadZipRange(*layout, off, n, part.data(), reader).ok());
    ASSERT_EQ(part, written.substr(off, n)) << off << "+" << n;
  }
}

// torch reads our ZIP64 records (forced here on a small file by lowering the
// thresholds; checkpoints over 4 GiB need them for real).
TEST_F(TorchSaved, Zip64LoadsInTorch) {
  auto file = Env::Default()->OpenRead(path_);
  ASSERT_TRUE(file.ok());
  auto tf = ReadTorchFile(**file, path_);
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  auto plan = PlanTorchFile("model_optim_rng", tf->root, Specs(*tf));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto layout = PlanZip(plan->members, ZipLimits{0, 0});
  ASSERT_TRUE(layout.ok());
  ASSERT_TRUE(layout->zip64);
  std::string bytes(layout->size, '\0');
  ASSERT_TRUE(
      ReadZipRange(*layout, 0, bytes.size(), bytes.data(), TorchMemberReader(*plan, ReaderOf(**file, *tf))).ok());
  const std::string out = *dir_ / "zip64.pt";
  Spit(out, bytes);
  auto [rc, log] = Sh(kClient + " torch-same " + path_ + " " + out + " && " + kPython + " -m zipfile -t " + out);
  EXPECT_EQ(rc, 0) << log;
  StringFile f(bytes, out);
  auto tf2 = ReadTorchFile(f, out);
  ASSERT_TRUE(tf2.ok()) << tf2.status().ToString();
  EXPECT_TRUE(tf2->zip.zip64);
  EXPECT_TRUE(VerifyTorchFileCrcs(f, *tf2, out).ok());
}

// A file without Namespace, numpy or floats (what torch 1.13's weights_only
// unpickler allows) loads with torch.load(weights_only=True).
TEST_F(TorchSaved, WeightsOnlyLoads) {
  auto file = Env::Default()->OpenRead(path_);
  ASSERT_TRUE(file.ok());
  auto tf = ReadTorchFile(**file, path_);
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  Value root = Value::Dict();
  root.Set("iteration", *tf->root.Find("iteration"));
  root.Set("model", *tf->root.Find("model"));
  std::vector<size_t> index;
  auto specs = SpecsUsedBy(*tf, root, &index);
  const std::string out = *dir_ / "weights_only.pt";
  ASSERT_TRUE(Write(out, "archive", root, specs, [&](size_t s, uint64_t off, size_t n, void* dst) {
                return (*file)->Read(tf->storages[index[s]].member.data_offset + off, n, dst);
              }).ok());
  auto [rc, log] = Sh(kClient + " torch-weights-only " + path_ + " " + out + " model");
  EXPECT_EQ(rc, 0) << log;
}

// ---------------------------------------------------------------- bad files

// A torch file from members given as strings.
std::string ZipOf(const std::vector<std::pair<std::string, std::string>>& members) {
  std::vector<ZipMember> zm;
  for (const auto& [name, data] : members) zm.push_back({name, data.size(), Crc32(0, data.data(), data.size())});
  auto layout = PlanZip(zm);
  EXPECT_TRUE(layout.ok());
  std::string out(layout->size, '\0');
  EXPECT_TRUE(ReadZipRange(*layout, 0, out.size(), out.data(), [&](size_t m, uint64_t off, size_t n, void* dst) {
                std::memcpy(dst, members[m].second.data() + off, n);
                return Status::OK();
              }).ok());
  return out;
}

Value TensorValue(const std::string& key, DType dtype, uint64_t numel, std::vector<int64_t> shape,
                  std::vector<int64_t> stride, int64_t offset = 0) {
  pickle::Tensor t;
  t.storage_key = key;
  t.dtype = dtype;
  t.storage_numel = numel;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  t.storage_offset = offset;
  return Value::FromTensor(t);
}

Status ReadBytes(const std::string& bytes, const std::string& name = "bad.pt") {
  StringFile f(bytes, name);
  return ReadTorchFile(f, name).status();
}

TEST(ReadTorchFile, Errors) {
  const Value root = Value::Dict(
      {{Value::Str("model"), Value::Dict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {2, 4}, {4, 1})}})}});
  const std::string pkl = pickle::Pickle(root);
  const std::string data(32, '\x01');
  const std::string good = ZipOf({{"x/data.pkl", pkl}, {"x/data/0", data}, {"x/version", "3\n"}});
  ASSERT_TRUE(ReadBytes(good).ok()) << ReadBytes(good).ToString();

  ExpectError(ReadBytes(good.substr(0, good.size() / 2)), {"bad.pt", "no end of central directory record"});
  ExpectError(ReadBytes(ZipOf({{"x/data/0", data}})), {"bad.pt: not a torch file: no member 'x/data.pkl'"});
  ExpectError(ReadBytes(ZipOf({{"data.pkl", pkl}})), {"bad.pt: not a torch file: member 'data.pkl' is not under"});
  ExpectError(ReadBytes(ZipOf({})), {"bad.pt: not a torch file: the zip archive is empty"});
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", pkl}, {"x/byteorder", "big"}, {"x/data/0", data}})),
              {"bad.pt: byte order 'big'", "little-endian torch files only"});
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl",
                                "\x80\x02"
                                "cos\nsystem\n."}})),
              {"unknown global 'os.system' in bad.pt: x/data.pkl at byte 2; ptcfs loads only checkpoint contents"});
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", pkl}})),
              {"bad.pt: tensor 'model.w' references storage '0' but there is no member 'x/data/0'"});
  // The storage member is shorter than numel x dtype size.
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", pkl}, {"x/data/0", data.substr(0, 28)}})),
              {"bad.pt: storage '0' (F32 x 8 elements, referenced by tensor 'model.w') needs 8 x 4 bytes but member "
               "'x/data/0' has 28"});
  // The tensor needs more elements than its storage has.
  const std::string big =
      pickle::Pickle(Value::Dict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {4, 4}, {4, 1})}}));
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", big}, {"x/data/0", data}})),
              {"bad.pt: tensor 'w' (offset 0, shape (4, 4), stride (4, 1)) needs 0 + 16 elements of storage '0', "
               "which has 8"});
  const std::string off = pickle::Pickle(Value::List({TensorValue("0", DType::kF32, 8, {2}, {1}, 7)}));
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", off}, {"x/data/0", data}})), {"bad.pt: tensor '0'", "needs 7 + 2"});
  // Two tensors disagree on the storage's dtype.
  const std::string mixed = pickle::Pickle(
      Value::List({TensorValue("0", DType::kF32, 8, {8}, {1}), TensorValue("0", DType::kI16, 16, {16}, {1})}));
  ExpectError(ReadBytes(ZipOf({{"x/data.pkl", mixed}, {"x/data/0", data}})),
              {"bad.pt: tensor '1' views storage '0' as I16 x 16, another tensor as F32 x 8"});
}

TEST(VerifyTorchFileCrcs, CorruptedStorage) {
  const Value root = Value::Dict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {8}, {1})}});
  std::string bytes = ZipOf({{"x/data.pkl", pickle::Pickle(root)}, {"x/data/0", std::string(32, 'a')}});
  StringFile clean(bytes, "crc.pt");
  auto tf = ReadTorchFile(clean, "crc.pt");
  ASSERT_TRUE(tf.ok());
  bytes[tf->storages[0].member.data_offset + 5] ^= 0x10;
  StringFile f(bytes, "crc.pt");
  auto tf2 = ReadTorchFile(f, "crc.pt");
  ASSERT_TRUE(tf2.ok());  // data is not read when parsing
  Status s = VerifyTorchFileCrcs(f, *tf2, "crc.pt");
  EXPECT_EQ(s.code(), Code::kCorruption);
  ExpectError(s, {"bad CRC-32 in member 'x/data/0' of crc.pt"});
}

TEST(PlanTorchFile, Errors) {
  const Value root = Value::Dict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {2, 4}, {4, 1})}});
  EXPECT_TRUE(PlanTorchFile("archive", root, {{"0", DType::kF32, 8}}).ok());
  ExpectError(PlanTorchFile("", root, {{"0", DType::kF32, 8}}).status(), {"archive name ''"});
  ExpectError(PlanTorchFile("a/b", root, {{"0", DType::kF32, 8}}).status(), {"archive name 'a/b'"});
  ExpectError(PlanTorchFile("archive", root, {}).status(),
              {"archive: tensor 'w' references storage '0', which is not listed"});
  ExpectError(PlanTorchFile("archive", root, {{"0", DType::kF16, 8}}).status(),
              {"tensor 'w' views storage '0' as F32 x 8 but it is listed as F16 x 8"});
  ExpectError(PlanTorchFile("archive", root, {{"0", DType::kF32, 8}, {"0", DType::kF32, 8}}).status(),
              {"storage key '0' repeats"});
  ExpectError(PlanTorchFile("archive", root, {{"a/0", DType::kF32, 8}}).status(), {"storage key 'a/0'"});
  const Value over = Value::Dict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {3, 4}, {4, 1})}});
  ExpectError(PlanTorchFile("archive", over, {{"0", DType::kF32, 8}}).status(),
              {"tensor 'w'", "needs 0 + 12 elements of storage '0', which has 8"});
}

TEST(ReadTensorData, StridedViews) {
  // A 4x6 storage of int16 0..23; views gathered in row-major order.
  std::string data;
  for (int16_t i = 0; i < 24; ++i) data.append(reinterpret_cast<const char*>(&i), 2);
  struct Case {
    std::vector<int64_t> shape, stride;
    int64_t offset;
    std::vector<int16_t> want;
  };
  const Case cases[] = {
      {{4, 6}, {6, 1}, 0, {}},  // contiguous: all 24
      {{6, 4}, {1, 6}, 0, {0, 6, 12, 18, 1, 7, 13, 19, 2, 8, 14, 20, 3, 9, 15, 21, 4, 10, 16, 22, 5, 11, 17, 23}},
      {{2, 3}, {6, 2}, 7, {7, 9, 11, 13, 15, 17}},        // rows 1-2, every other column from 1
      {{3, 2}, {0, 1}, 4, {4, 5, 4, 5, 4, 5}},            // expanded
      {{2, 1, 3}, {12, 5, 1}, 1, {1, 2, 3, 13, 14, 15}},  // size-1 dim with any stride
      {{0, 5}, {5, 1}, 0, {}},                            // empty
      {{}, {}, 23, {23}},                                 // scalar
  };
  for (const Case& c : cases) {
    std::vector<int16_t> want = c.want;
    if (c.shape == std::vector<int64_t>{4, 6})
      for (int16_t i = 0; i < 24; ++i) want.push_back(i);
    const Value root = Value::List({TensorValue("0", DType::kI16, 24, c.shape, c.stride, c.offset)});
    const std::string bytes = ZipOf({{"a/data.pkl", pickle::Pickle(root)}, {"a/data/0", data}});
    StringFile f(bytes, "v.pt");
    auto tf = ReadTorchFile(f, "v.pt");
    ASSERT_TRUE(tf.ok()) << tf.status().ToString();
    const pickle::Tensor& t = tf->root.items()[0].tensor();
    auto got = ReadTensorBytes(f, *tf, t, "v.pt");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, std::string(reinterpret_cast<const char*>(want.data()), want.size() * 2))
        << pickle::Value::FromTensor(t).DebugString();
  }
}

// Seeded mutations of a valid torch file and of its pickle: truncations, byte
// flips, insertions. Each must parse or fail cleanly (run under ASan in CI).
TEST(MiniFuzz, MutatedTorchFilesAndPickles) {
  pickle::Value args = pickle::Value::FromObject(
      pickle::Object{pickle::Global{"argparse", "Namespace"}, pickle::Object::Build::kNewObj, {}, {}, {}, {}, {}});
  ASSERT_TRUE(args.SetAttr("lr", Value::Float(0.5)).ok());
  ASSERT_TRUE(args.SetAttr("name", Value::Bytes("xy")).ok());
  const Value root = Value::Dict({
      {Value::Str("args"), args},
      {Value::Str("model"), Value::OrderedDict({{Value::Str("w"), TensorValue("0", DType::kF32, 8, {2, 4}, {4, 1})},
                                                {Value::Str("v"), TensorValue("0", DType::kF32, 8, {4}, {2}, 1)}})},
      {Value::Str("list"), Value::List({Value::Int(1), Value::Tuple({Value::Str("a"), Value::None()})})},
  });
  const std::string pkl = pickle::Pickle(root);
  const std::string file =
      ZipOf({{"x/data.pkl", pkl}, {"x/byteorder", "little"}, {"x/data/0", std::string(32, 'z')}, {"x/version", "3\n"}});
  std::mt19937_64 rng(TestSeed());
  int accepted = 0;
  for (int k = 0; k < 2000; ++k) {
    const bool zip = k % 2 == 0;
    std::string b = zip ? file : pkl;
    switch (rng() % 4) {
      case 0:
        b.resize(rng() % b.size());
        break;
      case 1:
        for (int f = 1 + rng() % 4; f > 0; --f) b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 2:
        b[rng() % b.size()] = static_cast<char>(rng());
        break;
      default:
        b.insert(rng() % b.size(), std::string(1 + rng() % 8, static_cast<char>(rng())));
        break;
    }
    if (zip) {
      StringFile f(b, "fuzz.pt");
      auto tf = ReadTorchFile(f, "fuzz.pt");
      if (!tf.ok()) continue;
      ++accepted;
      (void)VerifyTorchFileCrcs(f, *tf, "fuzz.pt");
      pickle::ForEachTensor(tf->root, [&](const std::string&, const pickle::Tensor& t) {
        if (TensorNumBytes(t) < (1 << 20)) (void)ReadTensorBytes(f, *tf, t, "fuzz.pt");
      });
    } else {
      auto v = pickle::Unpickle(b, "fuzz.pkl", pickle::UnpickleLimits{64, 100000});
      if (!v.ok()) continue;
      ++accepted;
      auto again = pickle::Unpickle(pickle::Pickle(*v), "again");
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_EQ(*again, *v);
    }
  }
  std::printf("accepted %d of 2000 mutations\n", accepted);
}

}  // namespace
}  // namespace ptc
