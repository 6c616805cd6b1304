// Parsing scales with the number of keys and tensors: a safetensors header of
// 100,000 tensors, a schema of 100,000 rules or layers, a pickle dict of
// 100,000 keys. Each of these was quadratic (nlohmann's parser callback, an
// ordered_json encoder, linear look-ups in a loop: 60 s for a 20,000-key
// header); the bounds below are generous for ASan builds and far below what
// the quadratic code took.
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ptc/format/pickle.h"
#include "ptc/format/safetensors.h"
#include "ptc/model/schema.h"
#include "ptc/model/view.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr int kKeys = 100'000;
// In-process parse or encode of 100,000 keys: 0.2-0.6 s in Release on 2 busy
// cores, 2-6 s under ASan+UBSan (the quadratic code: minutes).
#if defined(__SANITIZE_ADDRESS__)
constexpr double kBoundSeconds = 30;
#else
constexpr double kBoundSeconds = 5;
#endif
// A whole `ptcfs synth` of 100,000 tensors: 2-4 s in Release on 2 busy cores
// (the quadratic code ran for minutes).
constexpr double kSynthBoundSeconds = 30;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The entry of tensor i: one F32 element at data offset 4i.
std::string Entry(int i) {
  return "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) + "," +
         std::to_string(4 * i + 4) + "]}";
}

// A safetensors file's first 8 + N bytes: the length, then `json`.
std::string Prefix(const std::string& json) {
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((json.size() >> (8 * b)) & 0xff);
  return out + json;
}

// {"t.0": ..., ..., "t.<n-1>": ...} then `tail` (members of its own) and "}".
std::string HeaderJson(int n, const std::string& tail = "") {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (int i = 0; i < n; ++i) json += ",\"t." + std::to_string(i) + "\":" + Entry(i);
  return json + tail + "}";
}

TEST(ParseScaleTest, SafetensorsHeaderOf100kTensorsParsesInSeconds) {
  const std::string prefix = Prefix(HeaderJson(kKeys));
  const auto start = std::chrono::steady_clock::now();
  Result<SafetensorsHeader> h = ParseSafetensorsHeader("big.safetensors", prefix, prefix.size() + 4ull * kKeys);
  const double seconds = SecondsSince(start);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_LT(seconds, kBoundSeconds);
  ASSERT_EQ(h->tensors.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(h->metadata.at("format"), "pt");
  // Data order: t.i at 4i.
  for (int i : {0, 1, kKeys / 2, kKeys - 1}) {
    EXPECT_EQ(h->tensors[i].name, "t." + std::to_string(i));
    EXPECT_EQ(h->tensors[i].offset, prefix.size() + 4ull * i);
    EXPECT_EQ(h->tensors[i].shape, Shape{1});
  }
}

TEST(ParseScaleTest, DuplicateKeyAfter100kTensorsIsRefusedByName) {
  // The first tensor's name again, last: nlohmann would keep the last one.
  const std::string prefix = Prefix(HeaderJson(kKeys, ",\"t.0\":" + Entry(kKeys)));
  const auto start = std::chrono::steady_clock::now();
  Result<SafetensorsHeader> h = ParseSafetensorsHeader("big.safetensors", prefix, prefix.size() + 4ull * (kKeys + 1));
  EXPECT_LT(SecondsSince(start), kBoundSeconds);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message(), "big.safetensors: key 't.0' appears twice in the header");
}

TEST(ParseScaleTest, DuplicateFieldInTheLastOf100kTensorsIsRefusedByName) {
  const std::string last = ",\"last\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[" +
                           std::to_string(4 * kKeys) + "," + std::to_string(4 * kKeys + 4) + "]}";
  const std::string prefix = Prefix(HeaderJson(kKeys, last));
  Result<SafetensorsHeader> h = ParseSafetensorsHeader("big.safetensors", prefix, prefix.size() + 4ull * (kKeys + 1));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message(), "big.safetensors: tensor 'last': key 'dtype' appears twice");
}

TEST(ParseScaleTest, SyntaxErrorAfterADuplicateStillWins) {
  // As before: the whole text is parsed; invalid JSON is reported as such.
  const std::string text = "{\"a\":1,\"a\":2,}";
  Result<SafetensorsHeader> h = ParseSafetensorsHeader("x", Prefix(text), 8 + text.size());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message().rfind("x: header is not valid JSON: ", 0), 0u) << h.status().message();
}

TEST(ParseScaleTest, EncodeOf100kTensorsIsLinearAndParsesBack) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < kKeys; ++i) specs.push_back({"layers." + std::to_string(i) + ".w", DType::kBF16, {2, 3}});
  const auto start = std::chrono::steady_clock::now();
  Result<std::string> bytes = EncodeSafetensorsHeader(specs, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<SafetensorsHeader> h = ParseSafetensorsHeader("enc", *bytes, bytes->size() + 12ull * kKeys);
  EXPECT_LT(SecondsSince(start), kBoundSeconds);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), specs.size());
  for (int i : {0, kKeys - 1}) {
    EXPECT_EQ(h->tensors[i].name, specs[i].name);  // in the order given
    EXPECT_EQ(h->tensors[i].offset, h->data_start + 12ull * i);
  }
  // A repeated name is refused, naming it, however late.
  specs.push_back(specs[kKeys / 2]);
  Result<std::string> twice = EncodeSafetensorsHeader(specs, {});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "tensor 'layers.50000.w' is listed twice");
}

// `ptcfs synth` of a schema file; returns the exit code and output, and the seconds it took.
std::pair<int, std::string> TimedSynth(const TempDir& tmp, const std::string& schema_json, const std::string& dims,
                                       const std::string& config, double* seconds) {
  Spit(tmp / "schema.json", schema_json);
  const auto start = std::chrono::steady_clock::now();
  auto r = Ptcfs("synth --schema " + tmp / "schema.json" + " --dims " + dims + " --config " + config + " " +
                 tmp / "ckpt");
  *seconds = SecondsSince(start);
  return r;
}

TEST(ParseScaleTest, SynthOfSevenRulesOver16kLayersTakesSeconds) {
  // 7 per-layer rules x 2^14 layers (the layer limit, ptc/model/limits.h): 114,688 tensors.
  constexpr int kRules = 7, kLayers = 1 << 14;
  TempDir tmp;
  std::string schema = R"({"name": "wide", "tensors": [)";
  for (int r = 0; r < kRules; ++r) {
    schema += std::string(r ? ", " : "") + R"({"name": "layers.{i}.w)" + std::to_string(r) +
              R"(", "shape": [1], "pp": "layer"})";
  }
  schema += "]}";
  double seconds = 0;
  auto r = TimedSynth(tmp, schema, "layers=" + std::to_string(kLayers) + ",hidden=8,heads=1,vocab=8,seq=8",
                      "tp=1,pp=1,dp=1", &seconds);
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_LT(seconds, kSynthBoundSeconds);
  Result<SafetensorsHeader> h = ReadSafetensorsHeader(Env::Default(), tmp / "ckpt/rank-00000/model.safetensors");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), static_cast<size_t>(kRules * kLayers));
  EXPECT_EQ(h->tensors.back().name, "layers." + std::to_string(kLayers - 1) + ".w" + std::to_string(kRules - 1));
}

TEST(ParseScaleTest, SynthOf100kRulesHalfOfThemTiedTakesSeconds) {
  // 50,000 first-stage rules and 50,000 last-stage rules tied to them: with
  // pp=2 the last stage holds each tied rule (Schema::Find in a loop, before).
  constexpr int kHalf = kKeys / 2;
  std::string schema = R"({"name": "tied", "tensors": [)";
  for (int i = 0; i < kHalf; ++i) schema += R"({"name": "a)" + std::to_string(i) + R"(", "shape": [1], "pp": "first"},)";
  for (int i = 0; i < kHalf; ++i) {
    schema += R"({"name": "b)" + std::to_string(i) + R"(", "tied_to": "a)" + std::to_string(i) + R"(", "pp": "last"})";
    schema += i + 1 < kHalf ? "," : "]}";
  }
  TempDir tmp;
  double seconds = 0;
  auto r = TimedSynth(tmp, schema, "layers=2,hidden=8,heads=1,vocab=8,seq=8", "tp=1,pp=2,dp=1", &seconds);
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_LT(seconds, kSynthBoundSeconds);
  for (int rank : {0, 1}) {
    Result<SafetensorsHeader> h =
        ReadSafetensorsHeader(Env::Default(), tmp / ("ckpt/rank-0000" + std::to_string(rank) + "/model.safetensors"));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->tensors.size(), static_cast<size_t>(kHalf));
    EXPECT_EQ(h->tensors.back().name, (rank == 0 ? "a" : "b") + std::to_string(kHalf - 1));
  }
  // A tied_to naming no rule is still refused by name.
  const size_t at = schema.rfind("\"tied_to\": \"a");
  schema.replace(at, 13, "\"tied_to\": \"z");
  r = TimedSynth(tmp, schema, "layers=2,hidden=8,heads=1,vocab=8,seq=8", "tp=1,pp=2,dp=1", &seconds);
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find("rule 'b" + std::to_string(kHalf - 1) + "': tied_to 'z" + std::to_string(kHalf - 1) +
                          "' must name a first- or last-stage rule"),
            std::string::npos)
      << r.second;
}

TEST(ParseScaleTest, StoredShardsOfAZeroPieceOver100kParameters) {
  LocalTensor piece{"optimizer.exp_avg", DType::kF32, Shape{2 * kKeys}, {}};
  for (int i = 0; i < kKeys; ++i) {
    const std::string name = std::string("p").append(std::to_string(i)).append(".exp_avg");
    piece.segments.push_back({name, Box{{0}, {1}}, Layout{2 * i, {1}}});
    piece.segments.push_back({name, Box{{1}, {2}}, Layout{2 * i + 1, {1}}});
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<ShardKey> keys = StoredShards(piece);
  EXPECT_LT(SecondsSince(start), kBoundSeconds);
  ASSERT_EQ(keys.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(keys[7].tensor, "p7.exp_avg");  // in the order of first appearance
  EXPECT_EQ(keys[7].boxes, (std::vector<Box>{Box{{0}, {1}}, Box{{1}, {2}}}));
}

TEST(ParseScaleTest, DictIndexAnswersAsFind) {
  using pickle::Value;
  Value d = Value::Dict();
  auto key = [](int i) { return std::string("k").append(std::to_string(i)); };
  for (int i = 0; i < kKeys; ++i) d.pairs().emplace_back(Value::Str(key(i)), Value::Int(i));
  d.pairs().emplace_back(Value::Str("k5"), Value::Int(-1));  // repeated: Find answers the first
  d.pairs().emplace_back(Value::Int(7), Value::Str("seven"));
  d.pairs().emplace_back(Value::Float(1.5), Value::Str("float key"));
  pickle::DictIndex index;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kKeys; ++i) {
    const Value* v = index.Find(d, key(i));
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(v->as_int(), i);
  }
  EXPECT_LT(SecondsSince(start), kBoundSeconds);
  EXPECT_EQ(index.Find(d, "absent"), nullptr);
  EXPECT_EQ(index.Find(d, Value::Int(7))->as_str(), "seven");
  EXPECT_EQ(index.Find(d, Value::Int(8)), nullptr);
  EXPECT_EQ(index.Find(d, Value::Float(1.5))->as_str(), "float key");  // other kinds: as Find
  EXPECT_EQ(index.Find(Value::List(), "k1"), nullptr);                  // not a dict
}

}  // namespace
}  // namespace ptc
