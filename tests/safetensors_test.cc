#include "ptc/format/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "ptc/base/fault_injection_env.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

uint64_t Bytes(const TensorSpec& t) { return NumElements(t.shape) * DTypeSize(t.dtype); }

// Every dtype as a scalar, an empty tensor and a small matrix: "t<k>".
std::vector<TensorSpec> AllDTypeSpecs() {
  std::vector<TensorSpec> specs;
  const Shape shapes[] = {{}, {0, 3}, {2, 3}, {5}};
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : shapes) specs.push_back({"t" + std::to_string(specs.size()), dtype, shape});
  }
  return specs;
}

// Writes `specs` with Pattern data, appended in chunks of `chunk` bytes.
Status WriteFile(Env* env, const std::string& path, const std::vector<TensorSpec>& specs,
                 const std::map<std::string, std::string>& metadata, size_t chunk = 7) {
  PTC_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(env, path, specs, metadata));
  std::string data;
  for (size_t k = 0; k < specs.size(); ++k) data += Pattern(k, specs[k].dtype, Bytes(specs[k]));
  for (size_t at = 0; at < data.size(); at += chunk)
    PTC_RETURN_IF_ERROR(writer->Append(data.data() + at, std::min(chunk, data.size() - at)));
  return writer->Finish();
}

// 8-byte length + `json` + `data`.
std::string RawFile(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

// A failure whose message contains each of `parts`.
void ExpectError(const Result<SafetensorsHeader>& r, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.ok()) << "accepted, expected an error mentioning " << *parts.begin();
  for (const std::string& p : parts)
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().ToString();
}

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader("model.safetensors", file, file.size());
}

void ExpectBad(const std::string& json, const std::string& data, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(json);
  ExpectError(Parse(RawFile(json, data)), parts);
}

// Empty when `h` describes a well-formed file of `size` bytes.
std::string CheckInvariants(const SafetensorsHeader& h, uint64_t size) {
  if (h.data_start < 8 || h.data_start > size || h.file_size != size) return "bad data_start / file_size";
  uint64_t at = h.data_start;
  std::set<std::string> names;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.offset != at) return "tensor '" + e.name + "' does not start where the previous one ends";
    if (e.nbytes != static_cast<uint64_t>(NumElements(e.shape)) * DTypeSize(e.dtype)) return "nbytes of " + e.name;
    if (!names.insert(e.name).second) return "duplicate " + e.name;
    at += e.nbytes;
  }
  return at == size ? "" : "tensors do not reach the end of the file";
}

TEST(Safetensors, RoundTripEveryDTypeInMemory) {
  auto env = NewMemEnv();
  const auto specs = AllDTypeSpecs();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "h\xc3\xa9llo"}};
  ASSERT_TRUE(WriteFile(env.get(), "m.safetensors", specs, metadata).ok());
  auto h = ReadSafetensorsHeader(env.get(), "m.safetensors");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_start % 8, 0u);
  EXPECT_EQ(h->metadata, metadata);
  ASSERT_EQ(h->tensors.size(), specs.size());
  auto file = std::move(env->OpenRead("m.safetensors")).value();
  EXPECT_EQ(file->Size(), h->file_size);
  for (size_t k = 0; k < specs.size(); ++k) {
    const SafetensorsEntry* e = h->Find(specs[k].name);
    ASSERT_NE(e, nullptr) << specs[k].name;
    EXPECT_EQ(e->dtype, specs[k].dtype);
    EXPECT_EQ(e->shape, specs[k].shape);
    std::string got(e->nbytes, '\0');
    ASSERT_TRUE(file->Read(e->offset, e->nbytes, got.data()).ok());
    EXPECT_EQ(got, Pattern(k, specs[k].dtype, Bytes(specs[k]))) << specs[k].name;
  }
  EXPECT_EQ(CheckInvariants(*h, h->file_size), "");
  EXPECT_EQ(h->Find("absent"), nullptr);
}

TEST(Safetensors, RoundTripOnDiskAndEmptyFile) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(WriteFile(env, dir / "a.safetensors", AllDTypeSpecs(), {}, 4096).ok());
  auto h = ReadSafetensorsHeader(env, dir / "a.safetensors");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors.size(), AllDTypeSpecs().size());
  EXPECT_TRUE(h->metadata.empty());
  // No tensors at all: "{}" padded to 8 bytes.
  ASSERT_TRUE(WriteFile(env, dir / "empty.safetensors", {}, {}).ok());
  auto e = ReadSafetensorsHeader(env, dir / "empty.safetensors");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->tensors.empty());
  EXPECT_EQ(e->data_start, 16u);
}

TEST(Safetensors, HeaderIsPaddedWithSpaces) {
  auto bytes = EncodeSafetensorsHeader({{"a", DType::kF32, {2}}}, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size() % 8, 0u);
  EXPECT_EQ(bytes->substr(8, 28), R"({"__metadata__":{"k":"v"},"a)");
  auto h = ParseSafetensorsHeader("x", *bytes, bytes->size() + 8);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].offset, bytes->size());
}

TEST(Safetensors, ReaderAcceptsAnyHeaderLength) {
  // Unpadded (N = 61, data at 69), keys out of data order, a zero-size tensor
  // at the end, lower-case dtype and an unknown field.
  const std::string json =
      R"({"b":{"dtype":"u8","shape":[3],"data_offsets":[4,7],"x":1},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
      R"("z":{"dtype":"F16","shape":[2,0],"data_offsets":[7,7]}})";
  auto h = Parse(RawFile(json, "0123456"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].dtype, DType::kU8);
  EXPECT_EQ(h->tensors[2].name, "z");
  EXPECT_EQ(h->tensors[1].offset, 8 + json.size() + 4);
}

TEST(Safetensors, RejectsBadFraming) {
  ExpectError(Parse("1234567"), {"model.safetensors", "shorter than the 8-byte header length"});
  ExpectError(Parse(RawFile("{}").substr(0, 9)), {"model.safetensors", "runs past the end"});
  std::string huge = RawFile("");
  huge[3] = 0x10;  // N = 256 MiB
  ExpectError(ParseSafetensorsHeader("model.safetensors", huge, 1ull << 30), {"exceeds the limit"});
  ExpectError(ParseSafetensorsHeader("model.safetensors", RawFile("{}").substr(0, 9), 10),
              {"prefix holds 9 of the 10"});
  ExpectBad("{\"a\":", "", {"model.safetensors", "not valid JSON"});
  ExpectBad("[1, 2]", "", {"model.safetensors", "not a JSON object"});
  ExpectBad("{\"a\": \"\xff\"}", "", {"model.safetensors", "not valid JSON"});
  ExpectBad(std::string(40, '[') + std::string(40, ']'), "", {"nests deeper"});
}

TEST(Safetensors, RejectsBadTensorEntries) {
  ExpectBad(
      R"({"a.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[0,12]}})", std::string(12, 'x'),
      {"model.safetensors: tensor 'a.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 4] of F32 needs 32"});
  ExpectBad(R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "unknown dtype 'F17'"});
  ExpectBad(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "not a string"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "integers >= 0"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "integers >= 0"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "integers >= 0"});
  ExpectBad(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "missing \"dtype\""});
  ExpectBad(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "xxxx", {"tensor 'w'", "missing \"shape\""});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1]}})", "xxxx", {"tensor 'w'", "missing \"data_offsets\""});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "xxxx", {"tensor 'w'", "begin <= end"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "xxxx", {"tensor 'w'", "pair"});
  ExpectBad(R"({"w":[1]})", "", {"tensor 'w'", "not an object"});
  ExpectBad(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "",
            {"tensor 'w'", "overflows"});
  ExpectBad(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", "",
            {"tensor 'w'", "integers >= 0"});
}

TEST(Safetensors, RejectsOffsetsThatDoNotTile) {
  const std::string a = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  ExpectBad("{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})", std::string(10, 'x'),
            {"model.safetensors: tensor 'b'", "gap of 2 bytes"});
  ExpectBad("{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", std::string(6, 'x'),
            {"model.safetensors: tensor 'b'", "overlap tensor 'a'"});
  ExpectBad("{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", std::string(6, 'x'),
            {"model.safetensors: tensor 'b'", "past the end of the 6-byte data buffer"});
  ExpectBad("{" + a + "}", std::string(5, 'x'), {"model.safetensors", "1 bytes after the last tensor"});
  ExpectBad(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}})", std::string(5, 'x'),
            {"tensor 'a'", "gap of 1 bytes"});
  ExpectBad("{" + a + "," + a + "}", std::string(4, 'x'), {"model.safetensors", "key 'a' appears twice"});
  ExpectBad(R"({"a":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", std::string(4, 'x'),
            {"tensor 'a': key 'dtype' appears twice"});
}

TEST(Safetensors, RejectsBadMetadata) {
  ExpectBad(R"({"__metadata__":{"k":1}})", "", {"model.safetensors", "value of 'k' is not a string"});
  ExpectBad(R"({"__metadata__":["k"]})", "", {"model.safetensors", "__metadata__ is not an object"});
  ExpectBad(R"({"__metadata__":{"k":"v","k":"w"}})", "", {"key 'k' appears twice"});
}

TEST(Safetensors, ReadNamesTheFile) {
  auto env = NewMemEnv();
  ASSERT_TRUE(WriteFileAtomic(env.get(), "short.safetensors", "abc").ok());
  auto r = ReadSafetensorsHeader(env.get(), "short.safetensors");
  ExpectError(r, {"short.safetensors", "shorter than"});
  std::string file = RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "xx");
  ASSERT_TRUE(WriteFileAtomic(env.get(), "trunc.safetensors", file).ok());
  ExpectError(ReadSafetensorsHeader(env.get(), "trunc.safetensors"), {"trunc.safetensors: tensor 'a'", "past the end"});
  ASSERT_TRUE(WriteFileAtomic(env.get(), "long.safetensors", RawFile(std::string(500, ' ')).substr(0, 100)).ok());
  ExpectError(ReadSafetensorsHeader(env.get(), "long.safetensors"), {"long.safetensors", "runs past the end"});
  EXPECT_FALSE(ReadSafetensorsHeader(env.get(), "absent.safetensors").ok());
}

TEST(Safetensors, EncoderRejectsBadSpecs) {
  auto bad = [](std::vector<TensorSpec> specs, std::map<std::string, std::string> md, const std::string& part) {
    auto r = EncodeSafetensorsHeader(specs, md);
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().ToString();
  };
  bad({{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}, {}, "tensor 'a' is listed twice");
  bad({{"__metadata__", DType::kF32, {1}}}, {}, "invalid tensor name");
  bad({{"", DType::kF32, {1}}}, {}, "invalid tensor name");
  bad({{"a", DType::kF32, {2, -1}}}, {}, "tensor 'a': negative dimension");
  bad({{"a", DType::kF64, {1ll << 40, 1ll << 40}}}, {}, "tensor 'a': shape");
  bad({{"a\xff", DType::kF32, {1}}}, {}, "not valid UTF-8");
  bad({}, {{"k", "\xc3"}}, "not valid UTF-8");
  auto env = NewMemEnv();
  auto w = SafetensorsWriter::Create(env.get(), "x.safetensors", {{"a", DType::kF32, {-1}}}, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("x.safetensors: tensor 'a'"), std::string::npos) << w.status().ToString();
}

TEST(Safetensors, WriterChecksTheByteCount) {
  auto env = NewMemEnv();
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2}}, {"b", DType::kI16, {3}}};
  auto w = SafetensorsWriter::Create(env.get(), "w.safetensors", specs, {});
  ASSERT_TRUE(w.ok());
  const std::string data(14, 'x');
  EXPECT_EQ((*w)->header().tensors[1].offset, (*w)->header().data_start + 8);
  ASSERT_TRUE((*w)->Append(data.data(), 10).ok());
  Status s = (*w)->Finish();
  EXPECT_NE(s.message().find("w.safetensors: tensor 'b': only 2 of 6 bytes written"), std::string::npos)
      << s.ToString();
  s = (*w)->Append(data.data(), 5);
  EXPECT_NE(s.message().find("passes the end of the data (10 of 14"), std::string::npos) << s.ToString();
  ASSERT_TRUE((*w)->Append(data.data(), 4).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_FALSE((*w)->Append(data.data(), 0).ok());
  EXPECT_FALSE((*w)->Finish().ok());
  EXPECT_TRUE(ReadSafetensorsHeader(env.get(), "w.safetensors").ok());
}

TEST(Safetensors, WriterReportsEveryIOError) {
  auto base = NewMemEnv();
  FaultInjectionEnv env(base.get());
  const auto specs = AllDTypeSpecs();
  for (int n = 0;; ++n) {
    env.FailAfter(n);
    Status s = WriteFile(&env, "f.safetensors", specs, {}, 64);
    env.Disarm();
    if (s.ok()) break;
    EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
    ASSERT_LT(n, 1000) << "writer never succeeds";
  }
  EXPECT_TRUE(ReadSafetensorsHeader(base.get(), "f.safetensors").ok());
}

// An independent reader: JSON header + numpy.frombuffer, bytes and values compared.
constexpr char kPythonCheck[] = R"PY(
import json, struct, sys
import numpy as np
NP = {'F64': '<f8', 'F32': '<f4', 'F16': '<f2', 'BF16': 'V2', 'I64': '<i8', 'I32': '<i4', 'I16': '<i2',
      'I8': 'i1', 'U8': 'u1', 'BOOL': '?', 'F8_E4M3': 'u1', 'F8_E5M2': 'u1'}
buf = open(sys.argv[1], 'rb').read()
n, = struct.unpack('<Q', buf[:8])
assert (8 + n) % 8 == 0, 'header not padded'
header = json.loads(buf[8:8 + n])
meta = header.pop('__metadata__')
assert meta == {'format': 'pt', 'note': 'h\u00e9llo'}, meta
start, end = 8 + n, 0
for name, t in sorted(header.items(), key=lambda kv: kv[1]['data_offsets']):
    b, e = t['data_offsets']
    assert b == end, (name, 'gap or overlap')
    end = e
    dt = np.dtype(NP[t['dtype']])
    count = int(np.prod(t['shape']))
    arr = np.frombuffer(buf, dtype=dt, count=count, offset=start + b).reshape(t['shape'])
    if name.startswith('t'):
        k = int(name[1:])
        want = bytes(((k + i) & 1) if t['dtype'] == 'BOOL' else ((k * 37 + i * 11 + 5) & 0xff) for i in range(e - b))
        assert arr.tobytes() == want, name
assert start + end == len(buf), 'trailing bytes'
assert np.frombuffer(buf, '<f4', 3, start + header['f32']['data_offsets'][0]).tolist() == [1.5, -2.0, 3.25]
assert np.frombuffer(buf, '<i8', 2, start + header['i64']['data_offsets'][0]).tolist() == [-1, 2**40]
print('python check ok', len(header), 'tensors')
)PY";

TEST(Safetensors, NumpyReadsWhatWeWrite) {
  if (!HaveNumpy())
    GTEST_FAIL() << "/usr/bin/python3 lacks numpy: install python3-numpy (apt-get install python3-numpy)";
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  auto specs = AllDTypeSpecs();
  specs.push_back({"f32", DType::kF32, {3}});
  specs.push_back({"i64", DType::kI64, {2}});
  auto w = SafetensorsWriter::Create(Env::Default(), path, specs, {{"format", "pt"}, {"note", "h\xc3\xa9llo"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (size_t k = 0; k + 2 < specs.size(); ++k) {
    const std::string d = Pattern(k, specs[k].dtype, Bytes(specs[k]));
    ASSERT_TRUE((*w)->Append(d.data(), d.size()).ok());
  }
  const float f[] = {1.5f, -2.0f, 3.25f};  // little-endian host
  const int64_t i[] = {-1, int64_t{1} << 40};
  ASSERT_TRUE((*w)->Append(f, sizeof f).ok());
  ASSERT_TRUE((*w)->Append(i, sizeof i).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto [rc, out] = RunPythonScript(dir.path(), kPythonCheck, path);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("python check ok 50 tensors"), std::string::npos) << out;
}

TEST(SafetensorsFuzz, MutatedHeadersNeverCrashAndAcceptedOnesTile) {
  std::mt19937_64 rng(TestSeed());
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2, 3}},
                                   {"b", DType::kBF16, {4}},
                                   {"c", DType::kU8, {}},
                                   {"d", DType::kI64, {0, 5}},
                                   {"e", DType::kBool, {3}}};
  auto header = EncodeSafetensorsHeader(specs, {{"k", "v"}});
  ASSERT_TRUE(header.ok());
  const std::string json = header->substr(8);
  uint64_t data_size = 0;
  for (const TensorSpec& t : specs) data_size += Bytes(t);
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string file;
    if (iter % 4 == 0) {  // raw bytes, length prefix included
      file = *header + std::string(data_size, 'x');
      for (int m = 1 + rng() % 3; m > 0; --m) MutateOnce(rng, "0123456789{}[],:\"- .e", file);
    } else {  // consistent length prefix, mutated JSON, data of a nearby size
      std::string j = json;
      for (int m = 1 + rng() % 3; m > 0; --m) MutateOnce(rng, "0123456789{}[],:\"- .e", j);
      file = RawFile(j, std::string(data_size + rng() % 5 - 2 * (rng() % 2), 'x'));
    }
    const uint64_t size = file.size() + (rng() % 8 == 0 ? rng() % 16 : 0);
    auto r = ParseSafetensorsHeader("fuzz", file, size);
    if (!r.ok()) {
      ASSERT_EQ(r.status().message().rfind("fuzz: ", 0), 0u) << r.status().ToString();
      continue;
    }
    ++accepted;
    ASSERT_EQ(CheckInvariants(*r, size), "") << "iteration " << iter << ": " << file;
  }
  std::printf("accepted %d of 4000 mutated files\n", accepted);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace ptc
