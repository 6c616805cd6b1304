// Configs and dims that ask for too much (issue 24, items 3 and 4): a million
// ranks, ten million layers, a 4 TiB tensor, more local tensors than a layout
// may hold, a tensor larger than the machine's memory. Every command refuses
// them up front (ptc/model/limits.h): exit 2, one line naming the limit and
// the value, nothing written, at once (no command allocates for them first).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ptc/base/env.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/limits.h"
#include "test_util.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";
// 10^7 layers; a [vocab, hidden] embedding of 2^40 f32 elements (4 TiB).
constexpr const char* kHugeLayers = "layers=10000000,hidden=32,heads=4,vocab=128,seq=16";
constexpr const char* k4TiB = "layers=1,hidden=1048576,heads=1,vocab=1048576,seq=16";
constexpr const char* kMillionRanks = "tp=1,pp=1,dp=1000000";


// A small checkpoint (SRC) and its store (STORE), made once for every case.
class HostileLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir;
    auto [code, out] = Ptcfs(std::string("synth --schema megatron-gpt --dims ") + kDims +
                             " --optimizer adam --config tp=2,pp=2 " + Src());
    ASSERT_EQ(code, 0) << out;
    std::tie(code, out) =
        Ptcfs(std::string("import --schema megatron-gpt --dims ") + kDims + " --config tp=2,pp=2 " + Src() + " " + Store());
    ASSERT_EQ(code, 0) << out;
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string Src() { return *tmp_ / "src"; }
  static std::string Store() { return *tmp_ / "store"; }
  static std::string Out() { return *tmp_ / "out"; }

  // Runs `args`: exit 2 within two seconds, one line "ptcfs <command>: ..."
  // holding every one of `parts`, and nothing written (SRC and STORE as they
  // were, no OUT, no second store).
  static void ExpectRefused(const std::string& command, const std::string& args,
                            std::initializer_list<std::string> parts) {
    const auto src = Snapshot(Src()), store = Snapshot(Store());
    const auto start = std::chrono::steady_clock::now();
    auto [code, out] = Ptcfs(command + " " + args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(code, 2) << command << " " << args << ": " << out;
    EXPECT_LT(seconds, 2.0) << command << " " << args;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_TRUE(out.starts_with("ptcfs " + command + ": ")) << out;
    for (const std::string& part : parts) EXPECT_TRUE(Contains(out, part)) << "no '" << part << "' in: " << out;
    EXPECT_FALSE(fs::exists(Out())) << command << " wrote " << Out();
    EXPECT_FALSE(fs::exists(*tmp_ / "store2")) << command << " made a store";
    EXPECT_TRUE(src == Snapshot(Src())) << command << " changed " << Src();
    EXPECT_TRUE(store == Snapshot(Store())) << command << " changed " << Store();
  }

  static TempDir* tmp_;
};
TempDir* HostileLimitsTest::tmp_ = nullptr;

TEST_F(HostileLimitsTest, AMillionRanksIsRefusedByEveryCommand) {
  const std::initializer_list<std::string> parts = {"1000000 ranks", "limit of 65536 ranks"};
  ExpectRefused("plan", Store() + " --to " + kMillionRanks, parts);
  ExpectRefused("transform", Store() + " --to " + kMillionRanks, parts);
  ExpectRefused("export", std::string("--config ") + kMillionRanks + " " + Store() + " " + Out(), parts);
  ExpectRefused("export", std::string("--format npy --config ") + kMillionRanks + " " + Store() + " " + Out(), parts);
  ExpectRefused("synth", std::string("--schema megatron-gpt --dims ") + kDims + " --config " + kMillionRanks + " " + Out(),
                parts);
  ExpectRefused("import", std::string("--schema megatron-gpt --dims ") + kDims + " --config " + kMillionRanks + " " +
                              Src() + " " + (*tmp_ / "store2"),
                parts);
  ExpectRefused("diff", std::string("--schema megatron-gpt --dims ") + kDims + " --config-a tp=2,pp=2 --config-b " +
                            kMillionRanks + " " + Src() + " " + Src(),
                parts);
}

TEST_F(HostileLimitsTest, TenMillionLayersIsRefused) {
  const std::initializer_list<std::string> parts = {"layers=10000000", "limit of 16384 layers"};
  ExpectRefused("synth", std::string("--schema megatron-gpt --dims ") + kHugeLayers + " --config tp=1 " + Out(), parts);
  ExpectRefused("import", std::string("--schema megatron-gpt --dims ") + kHugeLayers + " --config tp=2,pp=2 " + Src() +
                              " " + (*tmp_ / "store2"),
                parts);
  ExpectRefused("diff", std::string("--schema megatron-gpt --dims ") + kHugeLayers +
                            " --config-a tp=2,pp=2 --config-b tp=2,pp=2 " + Src() + " " + Src(),
                parts);
}

TEST_F(HostileLimitsTest, AFourTebibyteTensorIsRefused) {
  // The word embeddings [vocab, hidden] come first in megatron-gpt.
  const std::initializer_list<std::string> parts = {"[1048576, 1048576]", "limit of 1099511627776 bytes (1.0 TiB)"};
  ExpectRefused("synth", std::string("--schema megatron-gpt --dims ") + k4TiB + " --config tp=1 " + Out(), parts);
  ExpectRefused("import", std::string("--schema megatron-gpt --dims ") + k4TiB + " --config tp=2,pp=2 " + Src() + " " +
                              (*tmp_ / "store2"),
                parts);
  ExpectRefused("diff", std::string("--schema megatron-gpt --dims ") + k4TiB +
                            " --config-a tp=2,pp=2 --config-b tp=2,pp=2 " + Src() + " " + Src(),
                parts);
}

TEST_F(HostileLimitsTest, TooManyLocalTensorsInALayoutIsRefused) {
  // 32768 ranks of 4 layers with Adam: each rank holds every tensor, 4 times.
  const std::initializer_list<std::string> parts = {"32768 ranks x", "limit of 524288 local tensors in a layout"};
  ExpectRefused("plan", Store() + " --to tp=1,pp=1,dp=32768", parts);
  ExpectRefused("transform", Store() + " --to tp=1,pp=1,dp=32768", parts);
  ExpectRefused("export", "--config tp=1,pp=1,dp=32768 " + Store() + " " + Out(), parts);
}

TEST(Limits, FilesWritten) {
  EXPECT_TRUE(CheckFilesWritten(kMaxFilesWritten, "out").ok());
  Status s = CheckFilesWritten(kMaxFilesWritten + 1, "out");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "out: would write 1048577 files, more than the limit of 1048576 files");
}

// The limits at their edges, as the parsers and ValidateConfig see them.
TEST(Limits, EdgesOfRanksLayersAndTensors) {
  EXPECT_TRUE(ParseConfig("tp=1,pp=1,dp=65536").ok());
  auto c = ParseConfig("tp=2,pp=1,dp=32769");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), "65538 ranks exceeds the limit of 65536")) << c.status().message();
  EXPECT_TRUE(ParseDims("layers=16384,hidden=32,heads=4,vocab=128,seq=16").ok());
  EXPECT_FALSE(ParseDims("layers=16385,hidden=32,heads=4,vocab=128,seq=16").ok());
  // A long config is cut in the message.
  auto long_config = ParseConfig("tp=1,pp=1,dp=65536,per_worker=1,workers=" + std::string(200, '0'));
  ASSERT_FALSE(long_config.ok());
  EXPECT_LT(long_config.status().message().size(), 400u) << long_config.status().message();
  // Exactly 1 TiB is allowed, one element more is not.
  ModelSpec spec = Spec("megatron-gpt", "layers=1,hidden=262144,heads=1,vocab=1048576,seq=16,ffn=64");
  auto size = CheckModelLimits(spec);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(size->largest_tensor, kMaxTensorBytes);
  spec.dims.vocab += 1;
  EXPECT_TRUE(Contains(CheckModelLimits(spec).status().message(), "limit of 1099511627776 bytes"));
  // A shape whose element count overflows 64 bits is refused, not wrapped.
  spec.dims.vocab = int64_t{1} << 40;
  spec.dims.hidden = int64_t{1} << 40;
  EXPECT_FALSE(CheckModelLimits(spec).ok());
}

// What a machine cannot hold: bytes held at once against Env::MemoryBytes.
TEST(Limits, HeldBytesAgainstTheMachine) {
  EXPECT_TRUE(CheckHeldBytes(4096, 4096, "x").ok());
  EXPECT_TRUE(CheckHeldBytes(uint64_t{1} << 40, 0, "x").ok());  // memory unknown: no check
  Status s = CheckHeldBytes(4097, 4096, "out: tensor 'w'");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "out: tensor 'w' of 4097 bytes (4.0 KiB) exceeds this machine's memory of 4096 bytes (4.0 KiB)");
  EXPECT_GT(Env::Default()->MemoryBytes(), uint64_t{1} << 20);
  const ModelSpec spec = Spec("megatron-gpt", kDims);
  EXPECT_TRUE(
      CheckCheckpointWrite(Env::Default(), FitLayout(spec, *ParseConfig("tp=2")), CheckpointFormat::kNpy, "out").ok());
}

TEST_F(HostileLimitsTest, SynthOfATensorBeyondTheMachinesMemoryIsRefused) {
  // A [3*hidden, hidden] f32 qkv weight of 768 GiB: under the 1 TiB limit, above any machine here.
  const std::string dims = "layers=1,hidden=262144,heads=1,vocab=64,seq=16,ffn=64";
  if (Env::Default()->MemoryBytes() >= (uint64_t{768} << 30)) GTEST_SKIP() << "this machine holds 768 GiB";
  ExpectRefused("synth", "--schema megatron-gpt --dims " + dims + " --config tp=1 " + Out(),
                {"exceeds this machine's memory of"});
}

}  // namespace
}  // namespace ptc
