// Synthetic values (ptc/model/synth.h): Adam state an Adam step accepts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ptc/model/synth.h"

namespace ptc {
namespace {

constexpr Index kCount = 4096;

std::vector<float> F32(std::string_view name, DType param_dtype, Index first = 0) {
  std::vector<float> v(kCount);
  SynthValues(name, 7, DType::kF32, first, kCount, v.data(), param_dtype);
  return v;
}

template <typename T>
std::vector<T> Raw(std::string_view name, DType dtype) {
  std::vector<T> v(kCount);
  SynthValues(name, 7, dtype, 0, kCount, v.data(), dtype);
  return v;
}

// IEEE half / fp8 bits to float (normal numbers, which synth makes).
float Small(uint32_t bits, int exp_bits, int man_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int exp = static_cast<int>((bits >> man_bits) & ((1u << exp_bits) - 1));
  const float v = std::ldexp(1.0f + static_cast<float>(bits & ((1u << man_bits) - 1)) / (1u << man_bits), exp - bias);
  return (bits >> (exp_bits + man_bits)) & 1 ? -v : v;
}

TEST(SynthTest, SecondMomentIsNeverNegativeAndFirstHasBothSigns) {
  const std::vector<float> sq = F32("decoder.layers.0.mlp.linear_fc1.weight.exp_avg_sq", DType::kBF16);
  const std::vector<float> m = F32("decoder.layers.0.mlp.linear_fc1.weight.exp_avg", DType::kBF16);
  int negative = 0;
  for (Index i = 0; i < kCount; ++i) {
    EXPECT_FALSE(std::signbit(sq[i])) << i << ": " << sq[i];
    EXPECT_TRUE(std::isfinite(sq[i]));
    negative += m[i] < 0;
  }
  EXPECT_GT(negative, kCount / 4);
  EXPECT_LT(negative, kCount * 3 / 4);
  // The magnitudes are the values the name would have had: the sign bit alone is cleared.
  std::vector<uint32_t> raw(kCount);
  SynthValues("w.exp_avg_sq", 7, DType::kF32, 0, kCount, raw.data(), DType::kF32);
  std::vector<uint32_t> again(kCount);
  SynthValues("w.exp_avg_sq", 7, DType::kF32, 100, kCount - 100, again.data(), DType::kF32);
  for (Index i = 100; i < kCount; ++i) ASSERT_EQ(raw[i], again[i - 100]) << i;  // a function of the index
}

TEST(SynthTest, MasterCopyEqualsTheParameterOfEveryDtype) {
  const std::string p = "decoder.layers.1.self_attention.linear_qkv.weight";
  {
    const std::vector<float> param = Raw<float>(p, DType::kF32);
    const std::vector<float> master = F32(p + ".fp32", DType::kF32);
    EXPECT_EQ(std::memcmp(param.data(), master.data(), kCount * 4), 0);
  }
  {
    const std::vector<uint16_t> param = Raw<uint16_t>(p, DType::kBF16);
    const std::vector<float> master = F32(p + ".fp32", DType::kBF16);
    for (Index i = 0; i < kCount; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &master[i], 4);
      ASSERT_EQ(bits, static_cast<uint32_t>(param[i]) << 16) << i;
    }
  }
  {
    const std::vector<uint16_t> param = Raw<uint16_t>(p, DType::kF16);
    const std::vector<float> master = F32(p + ".fp32", DType::kF16);
    for (Index i = 0; i < kCount; ++i) ASSERT_EQ(master[i], Small(param[i], 5, 10)) << i;
  }
  {
    const std::vector<uint8_t> param = Raw<uint8_t>(p, DType::kF8E4M3);
    const std::vector<float> master = F32(p + ".fp32", DType::kF8E4M3);
    for (Index i = 0; i < kCount; ++i) ASSERT_EQ(master[i], Small(param[i], 4, 3)) << i;
  }
  {
    const std::vector<double> param = Raw<double>(p, DType::kF64);
    const std::vector<float> master = F32(p + ".fp32", DType::kF64);
    for (Index i = 0; i < kCount; ++i) ASSERT_EQ(master[i], static_cast<float>(param[i])) << i;
  }
  // Any slice agrees with the whole (every layout's shards of the master agree).
  const std::vector<float> whole = F32(p + ".fp32", DType::kBF16);
  const std::vector<float> part = F32(p + ".fp32", DType::kBF16, 1000);
  for (Index i = 1000; i < kCount; ++i) ASSERT_EQ(whole[i], part[i - 1000]) << i;
}

TEST(SynthTest, AFirstAdamStepIsFinite) {
  // torch.optim.Adam's first step (step 1 after a loaded step 0 is not Megatron's case: its
  // loaded step is the iteration; both bias corrections are finite for step >= 1).
  const std::string p = "embedding.word_embeddings.weight";
  const std::vector<float> w = Raw<float>(p, DType::kF32), m = F32(p + ".exp_avg", DType::kF32),
                           v = F32(p + ".exp_avg_sq", DType::kF32), g = Raw<float>(p + ".grad", DType::kF32);
  const double b1 = 0.9, b2 = 0.999, lr = 1e-3, eps = 1e-8;
  for (int step : {1, 100}) {
    for (Index i = 0; i < kCount; ++i) {
      const double mi = b1 * m[i] + (1 - b1) * g[i], vi = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double update = lr * (mi / (1 - std::pow(b1, step))) / (std::sqrt(vi / (1 - std::pow(b2, step))) + eps);
      ASSERT_TRUE(std::isfinite(w[i] - update)) << step << " " << i;
    }
  }
}

}  // namespace
}  // namespace ptc
