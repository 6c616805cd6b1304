#include "ptc/format/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

uint64_t Bytes(DType dtype, const Shape& shape) { return NumElements(shape) * DTypeSize(dtype); }

std::string Preamble(int major, uint32_t len) {
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += '\0';
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) s += static_cast<char>((len >> (8 * i)) & 0xff);
  return s;
}

// A version 1.0 file prefix holding `dict` (no padding).
std::string WithDict(const std::string& dict) { return Preamble(1, dict.size()) + dict; }

void ExpectBad(const std::string& prefix, const std::string& part) {
  auto r = ParseNpyHeader("x.npy", prefix);
  ASSERT_FALSE(r.ok()) << "accepted; expected: " << part;
  EXPECT_EQ(r.status().message().rfind("x.npy: ", 0), 0u) << r.status().ToString();
  EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().ToString();
}

Status WriteNpy(Env* env, const std::string& path, DType dtype, const Shape& shape, const std::string& data) {
  PTC_ASSIGN_OR_RETURN(auto w, NpyWriter::Create(env, path, dtype, shape));
  for (size_t at = 0; at < data.size(); at += 5)
    PTC_RETURN_IF_ERROR(w->Append(data.data() + at, std::min<size_t>(5, data.size() - at)));
  return w->Finish();
}

TEST(Npy, HeaderMatchesNumpy) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string want = Preamble(1, 118) + dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  EXPECT_EQ(EncodeNpyHeader(DType::kF32, {2, 3}), want);
  EXPECT_NE(EncodeNpyHeader(DType::kF64, {}).find("'shape': (), }"), std::string::npos);
  EXPECT_NE(EncodeNpyHeader(DType::kBF16, {5}).find("{'descr': '<V2', 'fortran_order': False, 'shape': (5,), }"),
            std::string::npos);
  EXPECT_NE(EncodeNpyHeader(DType::kF8E5M2, {0}).find("'|V1'"), std::string::npos);
  for (DType t : kAllDTypes) EXPECT_EQ(EncodeNpyHeader(t, {3, 4, 5}).size() % 64, 0u);
}

TEST(Npy, RoundTripEveryDType) {
  auto env = NewMemEnv();
  const Shape shapes[] = {{}, {0}, {5}, {2, 0, 3}, {2, 3, 4}};
  int k = 0;
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : shapes) {
      const std::string path = "t" + std::to_string(k) + ".npy", data = Pattern(k, dtype, Bytes(dtype, shape));
      ++k;
      ASSERT_TRUE(WriteNpy(env.get(), path, dtype, shape, data).ok()) << path;
      auto file = ReadFileToString(env.get(), path);
      ASSERT_TRUE(file.ok());
      auto h = ParseNpyHeader(path, *file);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      const bool raw = dtype == DType::kBF16 || dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
      EXPECT_EQ(h->raw, raw);
      EXPECT_EQ(h->dtype, dtype == DType::kF8E5M2 ? DType::kF8E4M3 : dtype);
      EXPECT_EQ(h->shape, shape);
      EXPECT_EQ(h->data_offset % 64, 0u);
      EXPECT_EQ(h->nbytes, data.size());
      EXPECT_EQ(file->substr(h->data_offset), data);
    }
  }
}

TEST(Npy, Version2ForHugeHeaders) {
  const Shape shape(30000, 1);
  const std::string header = EncodeNpyHeader(DType::kI16, shape);
  EXPECT_EQ(header[6], '\x02');
  EXPECT_EQ(header.size() % 64, 0u);
  auto h = ParseNpyHeader("big.npy", header);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->shape, shape);
  EXPECT_EQ(h->data_offset, header.size());
  EXPECT_EQ(h->nbytes, 2u);
}

TEST(Npy, ParserAcceptsNumpyVariants) {
  auto h = ParseNpyHeader("x.npy", WithDict("{\"shape\":(2,3,),\"fortran_order\":False,\"descr\":\"|V2\"}  \n"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->dtype, DType::kBF16);
  EXPECT_TRUE(h->raw);
  EXPECT_EQ(h->shape, (Shape{2, 3}));
  EXPECT_EQ(h->nbytes, 12u);
  const std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': ()}";
  h = ParseNpyHeader("x.npy", Preamble(3, dict.size()) + dict + "data");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, 12 + dict.size());
  EXPECT_EQ(h->nbytes, 1u);
}

TEST(Npy, RejectsMalformedHeaders) {
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  ExpectBad("", "not an npy file");
  ExpectBad("\x93NUMPZ\x01\x00\x00\x00", "not an npy file");
  ExpectBad(Preamble(4, 0), "unsupported npy version 4.0");
  ExpectBad(Preamble(2, 0).substr(0, 11), "ends inside the npy preamble");
  ExpectBad(WithDict(ok_dict).substr(0, 40), "runs past the 40 bytes given");
  ExpectBad(WithDict("{'descr': '<f4', 'shape': (2,)}"), "lacks the key 'fortran_order'");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), "unexpected key 'x'");
  ExpectBad(WithDict("{'descr': '<f4', 'descr': '<f4'}"), "repeats the key 'descr'");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}"), "fortran_order True");
  ExpectBad(WithDict("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}"), "descr '>f4'");
  ExpectBad(WithDict("{'descr': '<u4', 'fortran_order': False, 'shape': (2,)}"), "descr '<u4'");
  ExpectBad(WithDict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}"), "quoted string");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}"), "negative dimension");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}"), "expected ',' or ')'");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"), "too large");
  ExpectBad(WithDict("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"), "overflows");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}"), "True or False");
  ExpectBad(WithDict("{'descr': '<f4"), "unterminated string");
  ExpectBad(WithDict(ok_dict + " x"), "unexpected text after the header dict");
  ExpectBad(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)"), "expected ',' or '}'");
}

TEST(Npy, DTypesSidecar) {
  std::map<std::string, DType> files = {{"a.npy", DType::kBF16}, {"b.npy", DType::kF8E5M2}, {"c.npy", DType::kF32}};
  auto text = EncodeNpyDTypes(files);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("\"b.npy\": \"F8_E5M2\""), std::string::npos) << *text;
  auto back = ParseNpyDTypes("dtypes.json", *text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, files);
  EXPECT_FALSE(EncodeNpyDTypes({{"\xff.npy", DType::kF32}}).ok());
  auto bad = ParseNpyDTypes("d/dtypes.json", R"({"a.npy": "F99"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("d/dtypes.json: 'a.npy': unknown dtype 'F99'"), std::string::npos)
      << bad.status().ToString();
  EXPECT_FALSE(ParseNpyDTypes("dtypes.json", "[1]").ok());
  EXPECT_FALSE(ParseNpyDTypes("dtypes.json", R"({"a.npy": 3})").ok());
}

TEST(Npy, WriterChecksTheByteCount) {
  auto env = NewMemEnv();
  auto bad = NpyWriter::Create(env.get(), "neg.npy", DType::kF32, {2, -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("neg.npy: shape [2, -1]"), std::string::npos) << bad.status().ToString();
  auto w = NpyWriter::Create(env.get(), "w.npy", DType::kI32, {3});
  ASSERT_TRUE(w.ok());
  const std::string data(12, 'x');
  ASSERT_TRUE((*w)->Append(data.data(), 8).ok());
  Status s = (*w)->Finish();
  EXPECT_NE(s.message().find("w.npy: only 8 of 12 data bytes written"), std::string::npos) << s.ToString();
  s = (*w)->Append(data.data(), 5);
  EXPECT_NE(s.message().find("passes the end of the data (8 of 12"), std::string::npos) << s.ToString();
  ASSERT_TRUE((*w)->Append(data.data(), 4).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_FALSE((*w)->Finish().ok());
}

// Loads what C++ wrote with np.load, then writes files for C++ to parse.
constexpr char kPythonCheck[] = R"PY(
import json, os, sys
import numpy as np
d = sys.argv[1]
DESCR = {'F64': '<f8', 'F32': '<f4', 'F16': '<f2', 'BF16': '|V2', 'I64': '<i8', 'I32': '<i4', 'I16': '<i2',
         'I8': '|i1', 'U8': '|u1', 'BOOL': '|b1', 'F8_E4M3': '|V1', 'F8_E5M2': '|V1'}
dtypes = json.load(open(os.path.join(d, 'dtypes.json')))
expect = json.load(open(os.path.join(d, 'expect.json')))
assert sorted(dtypes) == sorted(expect), 'dtypes.json lists other files'
for name, (k, dtype, shape) in expect.items():
    path = os.path.join(d, name)
    arr = np.load(path)
    assert dtypes[name] == dtype, name
    assert arr.dtype.str == DESCR[dtype], (name, arr.dtype.str)
    assert arr.shape == tuple(shape), (name, arr.shape)
    n = arr.nbytes
    want = bytes(((k + i) & 1) if dtype == 'BOOL' else ((k * 37 + i * 11 + 5) & 0xff) for i in range(n))
    assert arr.tobytes() == want, name
    with open(path, 'rb') as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        assert f.tell() % 64 == 0, name
assert np.load(os.path.join(d, 'values.npy')).tolist() == [[1.5, -2.0], [3.25, 0.0]]
py = os.path.join(d, 'py')
os.mkdir(py)
np.save(os.path.join(py, 'a.npy'), np.arange(6, dtype='<f4').reshape(2, 3))
np.save(os.path.join(py, 's.npy'), np.float64(2.5))
np.save(os.path.join(py, 'v.npy'), np.zeros(3, dtype='V2'))
np.save(os.path.join(py, 'b.npy'), np.array([True, False]))
with open(os.path.join(py, 'v2.npy'), 'wb') as f:
    np.lib.format.write_array(f, np.arange(4, dtype='<i2'), version=(2, 0))
np.save(os.path.join(py, 'f.npy'), np.asfortranarray(np.zeros((2, 3), '<f4')))
np.save(os.path.join(py, 'be.npy'), np.zeros(2, '>i4'))
np.save(os.path.join(py, 'u4.npy'), np.zeros(2, '<u4'))
print('python check ok', len(expect), 'files')
)PY";

Result<NpyHeader> ParseFile(const std::string& path, std::string* contents = nullptr) {
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(Env::Default(), path));
  if (contents) *contents = text;
  return ParseNpyHeader(path, text);
}

TEST(Npy, NumpyAgreesBothWays) {
  if (!HaveNumpy())
    GTEST_FAIL() << "/usr/bin/python3 lacks numpy: install python3-numpy (apt-get install python3-numpy)";
  TempDir dir;
  Env* env = Env::Default();
  std::map<std::string, DType> dtypes;
  nlohmann::json expect = nlohmann::json::object();
  const Shape shapes[] = {{}, {0, 2}, {5}, {2, 3, 4}};
  int k = 0;
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : shapes) {
      const std::string name = "t" + std::to_string(k) + ".npy";
      ASSERT_TRUE(WriteNpy(env, dir / name, dtype, shape, Pattern(k, dtype, Bytes(dtype, shape))).ok());
      dtypes[name] = dtype;
      expect[name] = {k++, DTypeName(dtype), shape};
    }
  }
  const float values[] = {1.5f, -2.0f, 3.25f, 0.0f};  // little-endian host
  ASSERT_TRUE(
      WriteNpy(env, dir / "values.npy", DType::kF32, {2, 2}, std::string(reinterpret_cast<const char*>(values), 16))
          .ok());
  ASSERT_TRUE(WriteFileAtomic(env, dir / "dtypes.json", *EncodeNpyDTypes(dtypes)).ok());
  ASSERT_TRUE(WriteFileAtomic(env, dir / "expect.json", expect.dump()).ok());
  auto [rc, out] = RunPythonScript(dir.path(), kPythonCheck, dir.path());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("python check ok 48 files"), std::string::npos) << out;

  std::string a;
  auto h = ParseFile(dir / "py/a.npy", &a);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->dtype, DType::kF32);
  EXPECT_EQ(h->shape, (Shape{2, 3}));
  const float want[] = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(a.substr(h->data_offset), std::string(reinterpret_cast<const char*>(want), sizeof want));
  h = ParseFile(dir / "py/s.npy");
  ASSERT_TRUE(h.ok() && h->dtype == DType::kF64 && h->shape.empty() && h->nbytes == 8) << h.status().ToString();
  h = ParseFile(dir / "py/v.npy");
  ASSERT_TRUE(h.ok() && h->dtype == DType::kBF16 && h->raw && h->shape == Shape{3}) << h.status().ToString();
  h = ParseFile(dir / "py/b.npy");
  ASSERT_TRUE(h.ok() && h->dtype == DType::kBool && h->shape == Shape{2}) << h.status().ToString();
  h = ParseFile(dir / "py/v2.npy");
  ASSERT_TRUE(h.ok() && h->dtype == DType::kI16 && h->shape == Shape{4}) << h.status().ToString();
  EXPECT_NE(ParseFile(dir / "py/f.npy").status().message().find("fortran_order True"), std::string::npos);
  EXPECT_NE(ParseFile(dir / "py/be.npy").status().message().find("descr '>i4'"), std::string::npos);
  EXPECT_NE(ParseFile(dir / "py/u4.npy").status().message().find("descr '<u4'"), std::string::npos);
}

TEST(NpyFuzz, MutatedHeadersNeverCrash) {
  std::mt19937_64 rng(TestSeed());
  static const std::string kChars = "0123456789(),:'\"- TrueFals{}";
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = EncodeNpyHeader(kAllDTypes[rng() % kNumDTypes], {2, 3});
    for (int m = 1 + rng() % 3; m > 0; --m) {
      MutateOnce(rng, kChars, s);
    }
    auto h = ParseNpyHeader("fuzz", s);
    if (!h.ok()) continue;
    ++accepted;
    ASSERT_LE(h->data_offset, s.size()) << s;
    ASSERT_EQ(h->nbytes, Bytes(h->dtype, h->shape)) << s;
  }
  std::printf("accepted %d of 4000 mutated headers\n", accepted);
}

}  // namespace
}  // namespace ptc
