// Generation manifest JSON: round trip, validation messages, checksums, and a
// randomised mutation test with a printed seed (override: PTCFS_TEST_SEED).
#include "ptc/store/manifest.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <random>

#include <zlib.h>

#include "ptc/base/checksum.h"
#include "ptc/store/rank_files.h"

namespace ptc {
namespace {

using json = nlohmann::json;

uint64_t Seed() {
  const char* env = std::getenv("PTCFS_TEST_SEED");
  uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("PTCFS_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

GenerationManifest Sample() {
  GenerationManifest m;
  m.generation = 3;
  m.parent = 2;
  m.schema = json::parse(R"({"name":"gpt","rules":[{"pattern":"layers.{L}.w","tp":{"split":0}}]})");
  m.dims = "layers=4,hidden=64";
  m.config = "tp=2,pp=1,dp=1";
  m.tensors = {{"layers.0.w", DType::kBF16, {8, 4}},
               {"mask", DType::kBool, {5}},
               {"scalar", DType::kF32, {}},
               {"f8", DType::kF8E4M3, {2, 3, 4}},
               {"big", DType::kF32, {2 * 1048576 + 25}}};
  m.shards.push_back({"layers.0.w",
                      {Box{{0, 0}, {4, 4}}},
                      0,
                      "gen-000003/worker-00/layers.0.w.s0.h5",
                      2048,
                      32,
                      0x0123456789abcdefULL});
  m.shards.push_back({"layers.0.w", {Box{{4, 0}, {8, 4}}}, 1, "gen-000001/worker-01/layers.0.w.s0.h5", 4096, 32, 7});
  m.shards.push_back({"mask", {Box{{0}, {2}}, Box{{3}, {5}}}, 0, "gen-000003/worker-00/mask.s0.h5", 100, 4, 0});
  m.shards.push_back({"scalar", {Box{{}, {}}}, 0, "gen-000003/worker-00/scalar.s0.h5", 100, 4, ~0ULL});
  m.shards.push_back({"f8", {Box{{0, 0, 0}, {2, 3, 4}}}, 2, "gen-000003/worker-02/f8.s0.h5", 0, 24, 1});
  const std::vector<uint64_t> blocks = {0x1111, 0xfedcba9876543210ULL, 3};
  m.shards.push_back({"big",
                      {Box::Full({2 * 1048576 + 25})},
                      0,
                      "gen-000003/worker-00/big.s0.h5",
                      4096,
                      4 * (2 * 1048576 + 25),
                      CombineBlockChecksums(blocks),
                      blocks});
  m.shards.back().block_crc32s = {0xdeadbeef, 0, 0x12345678};
  m.shards[0].block_crc32s = {0xcafe0001};
  m.extra = {{"dataset", {{"epoch", 1}, {"consumed", 1000}}}};
  // A rank file holding copies of two pieces of worker 0.
  m.rank_file_copies.push_back(
      {"gen-000003/worker-00/rank-00001.model.safetensors",
       0,
       {{"layers.0.w", {Box{{0, 0}, {4, 4}}}, 128}, {"mask", {Box{{0}, {2}}, Box{{3}, {5}}}, 160}}});
  return m;
}

TEST(Checksum, KnownValuesAndStreaming) {
  EXPECT_EQ(Xxh64("", 0), 0xef46db3751d8e999ULL);
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  Xxh64Stream s;
  for (size_t pos = 0; pos < data.size(); pos += 777)
    s.Update(data.data() + pos, std::min<size_t>(777, data.size() - pos));
  EXPECT_EQ(s.Digest(), Xxh64(data.data(), data.size()));
  s.Reset();
  EXPECT_EQ(s.Digest(), 0xef46db3751d8e999ULL);
}

TEST(Checksum, ShardBlocks) {
  std::mt19937_64 rng(5);
  for (uint64_t n :
       {uint64_t{0}, uint64_t{1000}, kChecksumBlockBytes, kChecksumBlockBytes + 1, 2 * kChecksumBlockBytes + 12345}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    ShardHasher h;
    for (size_t pos = 0; pos < n;) {
      const size_t take = std::min<size_t>(n - pos, rng() % (3 << 20) + 1);
      h.Update(data.data() + pos, take);
      pos += take;
    }
    ShardDigest d = h.Finish();
    if (n <= kChecksumBlockBytes) {
      EXPECT_TRUE(d.blocks.empty()) << n;
      EXPECT_EQ(d.checksum, Xxh64(data.data(), n)) << n;
      continue;
    }
    ASSERT_EQ(d.blocks.size(), (n + kChecksumBlockBytes - 1) / kChecksumBlockBytes) << n;
    for (size_t b = 0; b < d.blocks.size(); ++b) {
      const uint64_t at = b * kChecksumBlockBytes;
      EXPECT_EQ(d.blocks[b], Xxh64(data.data() + at, std::min<uint64_t>(kChecksumBlockBytes, n - at))) << b;
    }
    std::string words;
    for (uint64_t b : d.blocks) {
      for (int i = 0; i < 8; ++i) words.push_back(static_cast<char>(b >> (8 * i)));
    }
    EXPECT_EQ(d.checksum, Xxh64(words.data(), words.size()));
    EXPECT_EQ(d.checksum, CombineBlockChecksums(d.blocks));
  }
  // The block CRC-32s: zip's CRC of each block, one for a shard of at most one block (or none).
  for (uint64_t n : {uint64_t{0}, uint64_t{1000}, kChecksumBlockBytes, 2 * kChecksumBlockBytes + 12345}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    ShardHasher h;
    BlockCrcs alone;
    for (size_t pos = 0; pos < n;) {
      const size_t take = std::min<size_t>(n - pos, rng() % (3 << 20) + 1);
      h.Update(data.data() + pos, take);
      alone.Update(data.data() + pos, take);
      pos += take;
    }
    const std::vector<uint32_t> crcs = h.Finish().crc32s;
    ASSERT_EQ(crcs.size(), std::max<uint64_t>(1, (n + kChecksumBlockBytes - 1) / kChecksumBlockBytes)) << n;
    EXPECT_EQ(alone.Finish(), crcs);
    for (size_t b = 0; b < crcs.size(); ++b) {
      const uint64_t at = b * kChecksumBlockBytes;
      EXPECT_EQ(crcs[b], crc32(0, reinterpret_cast<const Bytef*>(data.data() + at),
                               static_cast<uInt>(std::min<uint64_t>(kChecksumBlockBytes, n - at))))
          << b;
    }
  }
  EXPECT_EQ(BlockChecksumsToString({1, 0xfedcba9876543210ULL}), "0000000000000001fedcba9876543210");
  EXPECT_EQ(*ParseBlockChecksums("0000000000000001FEDCBA9876543210"),
            (std::vector<uint64_t>{1, 0xfedcba9876543210ULL}));
  EXPECT_TRUE(ParseBlockChecksums("")->empty());
  EXPECT_EQ(ParseBlockChecksums("00000000000000011").status().code(), Code::kInvalidArgument);
  EXPECT_NE(ParseBlockChecksums("0000000000000001000000000000000x").status().message().find("block checksum 1"),
            std::string::npos);
  EXPECT_EQ(ParseBlockChecksums("00000000000000011").status().message(),
            "block checksums of 17 characters (expected 16 hex digits per block)");
  // The block CRC-32s' codec, the same over 8 digits.
  EXPECT_EQ(BlockCrc32sToString({1, 0xdeadbeef}), "00000001deadbeef");
  EXPECT_EQ(*ParseBlockCrc32s("00000001DEADBEEF"), (std::vector<uint32_t>{1, 0xdeadbeef}));
  EXPECT_TRUE(ParseBlockCrc32s("")->empty());
  EXPECT_EQ(ParseBlockCrc32s("000000011").status().message(),
            "block CRC-32s of 9 characters (expected 8 hex digits per block)");
  EXPECT_EQ(ParseBlockCrc32s("00000001deadbeeg").status().message(), "block CRC-32 1 'deadbeeg' is not 8 hex digits");
  EXPECT_EQ(ParseBlockChecksums("000000000000000100000000deadbeeg").status().message(),
            "block checksum 1 '00000000deadbeeg' is not 16 hex digits");
}

// The manifest bytes the writer's hasher leads to stay what they were before
// the one-pass hasher (issue 42): shards of sizes around block edges, fed in
// writes of several sizes (one byte to 40 MiB), hashed, recorded and encoded;
// the manifest's xxh64 is the one the two-pass hasher gave (commit 6c4d534).
TEST(Checksum, ManifestBytesOfHashedShardsAreUnchanged) {
  const uint64_t B = kChecksumBlockBytes;
  std::string data(10 * B + 777, '\0');
  uint64_t x = 88172645463325252ULL;  // xorshift64: the same bytes on every machine
  for (char& c : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  GenerationManifest m = Sample();
  m.shards.clear();
  const std::vector<uint64_t> sizes = {0, 1, 1000, B - 1, B, B + 1, 2 * B + 12345, 10 * B + 777};
  const std::vector<size_t> writes = {1 << 20, 1, 4093, 16 << 20, 40 << 20, 3 << 20, 1 << 19, 10 * (1 << 22)};
  for (size_t i = 0; i < sizes.size(); ++i) {
    ShardHasher h;
    for (uint64_t pos = 0; pos < sizes[i];) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(sizes[i] - pos, pos < 4096 ? 4093 : writes[i]));
      h.Update(data.data() + pos, take);
      pos += take;
    }
    ShardDigest d = h.Finish();
    ShardRecord r{"big", {Box::Full({2 * 1048576 + 25})}, 0, "gen-000003/worker-00/s" + std::to_string(i) + ".h5",
                  4096, sizes[i], d.checksum, d.blocks};
    r.block_crc32s = d.crc32s;
    m.shards.push_back(std::move(r));
  }
  const std::string text = EncodeManifest(m);
  EXPECT_EQ(ChecksumToString(Xxh64(text.data(), text.size())), "xxh64:ec5315430ce85a1e") << text.substr(0, 4000);
}

TEST(Checksum, StringForm) {
  EXPECT_EQ(ChecksumToString(0xef46db3751d8e999ULL), "xxh64:ef46db3751d8e999");
  EXPECT_EQ(ChecksumToString(1), "xxh64:0000000000000001");
  EXPECT_EQ(*ParseChecksum("xxh64:EF46DB3751D8E999"), 0xef46db3751d8e999ULL);
  for (const char* bad :
       {"", "xxh64:", "xxh64:123", "crc32:ef46db3751d8e999", "xxh64:ef46db3751d8e99g", "xxh64:ef46db3751d8e9990"}) {
    Result<uint64_t> r = ParseChecksum(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(Manifest, RoundTripIsExactAndStable) {
  GenerationManifest m = Sample();
  std::string text = EncodeManifest(m);
  Result<GenerationManifest> back = DecodeManifest("m.json", text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(EncodeManifest(*back), text);
  EXPECT_EQ(text.find("\"format\""), text.find('"'));  // fixed key order: format first
  EXPECT_NE(text.find("\"checksum\": \"xxh64:0123456789abcdef\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"parent\": 2"), std::string::npos);
  EXPECT_NE(text.find("\"crc32s\": \"deadbeef0000000012345678\""), std::string::npos) << text;
  // A manifest without block CRC-32s (every older one) decodes without them.
  for (ShardRecord& s : m.shards) s.block_crc32s.clear();
  text = EncodeManifest(m);
  EXPECT_EQ(text.find("crc32s"), std::string::npos);
  back = DecodeManifest("m.json", text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);

  // A manifest without copies (every older one) has no "rank_file_copies" and decodes.
  m.rank_file_copies.clear();
  text = EncodeManifest(m);
  EXPECT_EQ(text.find("rank_file_copies"), std::string::npos);
  back = DecodeManifest("m.json", text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);

  m.parent.reset();
  m.shards.clear();
  back = DecodeManifest("m.json", EncodeManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
}

TEST(Manifest, CopiesAsRecordsOfTheirPieces) {
  const GenerationManifest m = Sample();
  const std::vector<ShardRecord> records = CopyRecords(m);
  ASSERT_EQ(records.size(), 2u);
  ShardRecord want = m.shards[0];
  want.file = "gen-000003/worker-00/rank-00001.model.safetensors";
  want.offset = 128;
  EXPECT_EQ(records[0], want);  // the piece's checksums, at the copy's place
  EXPECT_EQ(records[1].checksum, m.shards[2].checksum);
  EXPECT_EQ(records[1].offset, 160u);
  const auto by_piece = CopiesByPiece(m);
  ASSERT_EQ(by_piece.size(), 2u);
  ASSERT_EQ(by_piece.at(&m.shards[0]).size(), 1u);
  EXPECT_EQ(by_piece.at(&m.shards[0])[0].offset, 128u);
  EXPECT_EQ(by_piece.count(&m.shards[1]), 0u);  // worker 1's piece: no copy
}

TEST(Manifest, FindTensorAndSafePaths) {
  GenerationManifest m = Sample();
  ASSERT_NE(FindTensor(m, "mask"), nullptr);
  EXPECT_EQ(FindTensor(m, "nope"), nullptr);
  EXPECT_TRUE(IsSafeRelativePath("gen-000001/worker-00/x.s0.h5"));
  for (const char* bad : {"", "/abs", "a/../b", "..", "a//b", "a/./b", "a/"})
    EXPECT_FALSE(IsSafeRelativePath(bad)) << bad;
}

struct BadCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* expect;  // substring of the message
};

TEST(Manifest, ValidationMessagesNameTheFault) {
  const std::vector<BadCase> cases = {
      {"unknown dtype", [](json& j) { j["tensors"][1]["dtype"] = "F12"; }, "tensor 1 ('mask'): unknown dtype 'F12'"},
      {"duplicate tensor", [](json& j) { j["tensors"][1]["name"] = "layers.0.w"; }, "'layers.0.w' is listed twice"},
      {"negative dim", [](json& j) { j["tensors"][0]["shape"][0] = -1; }, "shape must hold non-negative"},
      {"unknown tensor", [](json& j) { j["shards"][2]["tensor"] = "ghost"; }, "shard 2: unknown tensor 'ghost'"},
      {"box outside", [](json& j) { j["shards"][0]["boxes"][0][1][0] = 9; },
       "shard 0: tensor 'layers.0.w' shape [8, 4]: box"},
      {"begin > end", [](json& j) { j["shards"][0]["boxes"][0][0][0] = 5; }, "begin > end"},
      {"wrong rank", [](json& j) { j["shards"][1]["boxes"][0] = json::parse("[[4],[8]]"); }, "expected rank 2"},
      {"nbytes", [](json& j) { j["shards"][1]["nbytes"] = 33; }, "nbytes 33 != 16 elements * 2 bytes (BF16)"},
      {"dotdot", [](json& j) { j["shards"][0]["file"] = "gen-000001/../../etc/passwd"; }, "must be a relative path"},
      {"absolute", [](json& j) { j["shards"][0]["file"] = "/etc/passwd"; }, "must be a relative path"},
      {"checksum", [](json& j) { j["shards"][3]["checksum"] = "xxh64:zz"; }, "shard 3 (tensor 'scalar'): bad checksum"},
      {"checksum type", [](json& j) { j["shards"][3]["checksum"] = 5; }, "\"checksum\" must be a string"},
      {"block count", [](json& j) { j["shards"][5]["block_checksums"] = std::string(32, '0'); },
       "shard 5 (tensor 'big'): \"block_checksums\" has 2 blocks; a shard of 8388708 bytes has 3"},
      {"blocks of a small shard", [](json& j) { j["shards"][0]["block_checksums"] = std::string(16, '0'); },
       "\"block_checksums\" has 1 blocks; a shard of 32 bytes has none"},
      {"blocks vs checksum", [](json& j) { j["shards"][5]["checksum"] = "xxh64:0000000000000001"; },
       "\"block_checksums\" do not hash to the shard checksum xxh64:0000000000000001"},
      {"block hex", [](json& j) { j["shards"][5]["block_checksums"] = std::string(47, '0') + "g"; },
       "shard 5 (tensor 'big'): block checksum 2"},
      {"blocks type", [](json& j) { j["shards"][5]["block_checksums"] = json::array(); },
       "\"block_checksums\" must be a string"},
      {"crc count", [](json& j) { j["shards"][5]["crc32s"] = std::string(16, '0'); },
       "shard 5: tensor 'big' shape [2097177]: 2 block CRC-32s for 3 checksum blocks"},
      {"crc hex", [](json& j) { j["shards"][0]["crc32s"] = "0000000g"; },
       "shard 0 (tensor 'layers.0.w'): block CRC-32 0 '0000000g' is not 8 hex digits"},
      {"crc length", [](json& j) { j["shards"][0]["crc32s"] = "000000000"; },
       "block CRC-32s of 9 characters (expected 8 hex digits per block)"},
      {"crc type", [](json& j) { j["shards"][0]["crc32s"] = 5; }, "\"crc32s\" must be a string"},
      {"missing offset", [](json& j) { j["shards"][4].erase("offset"); },
       "shard 4 (tensor 'f8'): \"offset\" is missing"},
      {"float offset", [](json& j) { j["shards"][4]["offset"] = 1.5; }, "\"offset\" must be a non-negative integer"},
      {"format", [](json& j) { j["format"] = "other"; }, "\"format\" is 'other'"},
      {"version", [](json& j) { j["version"] = 2; }, "this build reads version 1"},
      {"parent", [](json& j) { j["parent"] = 3; }, "\"parent\" must be lower"},
      {"tensors type", [](json& j) { j["tensors"] = json::object(); }, "\"tensors\" must be an array"},
      {"extra type", [](json& j) { j["extra"] = 1; }, "\"extra\" must be an object"},
      {"box shape", [](json& j) { j["shards"][0]["boxes"][0] = json::array({1}); },
       "box 0 must be [[begin...], [end...]]"},
      {"not object", [](json& j) { j = json::array(); }, "must be a JSON object"},
      {"copy of no piece",
       [](json& j) { j["rank_file_copies"][0]["copies"][0]["boxes"] = json::parse("[[[4,0],[8,4]]]"); },
       "rank_file_copies 0 ('gen-000003/worker-00/rank-00001.model.safetensors'): copy 0 (tensor 'layers.0.w'): "
       "worker 0 stores no piece of these boxes"},
      {"copy of another worker's piece", [](json& j) { j["rank_file_copies"][0]["worker"] = 2; },
       "copy 0 (tensor 'layers.0.w'): worker 2 stores no piece"},
      {"copy of an unknown tensor", [](json& j) { j["rank_file_copies"][0]["copies"][1]["tensor"] = "ghost"; },
       "copy 1 (tensor 'ghost'): worker 0 stores no piece"},
      {"copies overlap", [](json& j) { j["rank_file_copies"][0]["copies"][1]["offset"] = 130; },
       "rank-00001.model.safetensors'): copies overlap at byte 130"},
      {"copy offset overflows",
       [](json& j) { j["rank_file_copies"][0]["copies"][0]["offset"] = 18446744073709551615ULL; },
       "copy 0 (tensor 'layers.0.w'): \"offset\" is too large"},
      {"copy without offset", [](json& j) { j["rank_file_copies"][0]["copies"][1].erase("offset"); },
       "copy 1 (tensor 'mask'): \"offset\" is missing"},
      {"copy file unsafe", [](json& j) { j["rank_file_copies"][0]["file"] = "../x"; },
       "rank_file_copies 0 ('../x'): file must be a relative path"},
      {"copy file twice", [](json& j) { j["rank_file_copies"].push_back(j["rank_file_copies"][0]); },
       "rank_file_copies 1: file 'gen-000003/worker-00/rank-00001.model.safetensors' is listed twice"},
      {"copies type", [](json& j) { j["rank_file_copies"][0]["copies"] = json::object(); },
       "\"copies\" must be an array"},
      {"copy not object", [](json& j) { j["rank_file_copies"][0]["copies"][0] = 1; }, "copy 0: must be an object"},
      {"rank_file_copies type", [](json& j) { j["rank_file_copies"] = json::object(); },
       "\"rank_file_copies\" must be an array"},
  };
  const json good = json::parse(EncodeManifest(Sample()));
  for (const BadCase& c : cases) {
    json j = good;
    c.mutate(j);
    Result<GenerationManifest> r = DecodeManifest("STORE/gen-000003/manifest.json", j.dump());
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << c.what;
    EXPECT_EQ(r.status().message().rfind("STORE/gen-000003/manifest.json: ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.what << ": " << r.status().message();
  }
  Result<GenerationManifest> r = DecodeManifest("x.json", "{\"format\": ");
  EXPECT_EQ(r.status().message(), "x.json: not valid JSON");
}

// ---------------------------------------------------------------- mini fuzz

void CollectPointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) CollectPointers(it.value(), at / it.key(), out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) CollectPointers(j[i], at / i, out);
  }
}

json RandomValue(std::mt19937_64& rng) {
  static const std::vector<json> kValues = {nullptr,
                                            true,
                                            -1,
                                            0,
                                            1,
                                            2,
                                            7,
                                            1.5,
                                            1e300,
                                            "",
                                            "x",
                                            "BF16",
                                            "xxh64:0000000000000000",
                                            "../x",
                                            json::array(),
                                            json::object(),
                                            json::parse("[[0],[1]]"),
                                            json::parse("[[[0,0],[1,1]]]"),
                                            json(18446744073709551615ULL),
                                            json(9223372036854775807LL),
                                            json(-9223372036854775807LL - 1)};
  return kValues[rng() % kValues.size()];
}

std::string MutateText(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> kTokens = {"{",    "}",    "[",    "]",           ",",     ":",
                                                   "\"",   "\\",   "null", "-",           "0",     "1e999",
                                                   "\xff", "\xc3", " ",    "\"tensors\"", "\"x\":"};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !text.empty(); ++e) {
    const size_t pos = rng() % text.size();
    switch (rng() % 5) {
      case 0:
        text[pos] = static_cast<char>(rng() % 256);
        break;
      case 1:
        text.erase(pos, 1 + rng() % 16);
        break;
      case 2:
        text.insert(pos, kTokens[rng() % kTokens.size()]);
        break;
      case 3:
        text.insert(pos, text.substr(rng() % text.size(), 1 + rng() % 32));
        break;
      case 4:
        text.resize(pos);
        break;
    }
  }
  return text;
}

void CheckDecodeIsSafe(const std::string& text, const std::string& what) {
  Result<GenerationManifest> r = DecodeManifest("fuzz.json", text);
  if (!r.ok()) {
    ASSERT_EQ(r.status().code(), Code::kCorruption) << what;
    ASSERT_EQ(r.status().message().rfind("fuzz.json: ", 0), 0u) << what << ": " << r.status().message();
    ASSERT_GT(r.status().message().size(), std::string("fuzz.json: ").size()) << what;
    return;
  }
  // Whatever decodes re-encodes to something that decodes to the same manifest.
  Result<GenerationManifest> again = DecodeManifest("fuzz.json", EncodeManifest(*r));
  ASSERT_TRUE(again.ok()) << what << ": " << again.status().ToString();
  ASSERT_EQ(*again, *r) << what;
}

TEST(ManifestFuzz, TextMutationsNeverCrash) {
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  const std::string good = EncodeManifest(Sample());
  for (int i = 0; i < 4000; ++i) {
    std::string text = MutateText(good, rng);
    CheckDecodeIsSafe(text, "seed " + std::to_string(seed) + " iteration " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
}

TEST(ManifestFuzz, StructuralMutationsNeverCrash) {
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  const json good = json::parse(EncodeManifest(Sample()));
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    json j = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      std::vector<json::json_pointer> pointers;
      CollectPointers(j, json::json_pointer(), pointers);
      const json::json_pointer& p = pointers[rng() % pointers.size()];
      if (p.empty()) continue;
      if (rng() % 4 == 0) {
        json& parent = j[p.parent_pointer()];
        if (parent.is_object())
          parent.erase(p.back());
        else if (parent.is_array() && !parent.empty())
          parent.erase(parent.size() - 1);
      } else {
        j[p] = RandomValue(rng);
      }
    }
    CheckDecodeIsSafe(j.dump(), "seed " + std::to_string(seed) + " iteration " + std::to_string(i));
    if (HasFatalFailure()) return;
    accepted += DecodeManifest("x", j.dump()).ok();
  }
  std::printf("structural mutations accepted: %d of 4000\n", accepted);
}

}  // namespace
}  // namespace ptc
