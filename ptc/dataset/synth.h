// Synthetic Megatron datasets, for tests, benchmarks and the README: sample i
// is a deterministic function of (seed, i) only, so any sample can be
// recomputed without the files.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc {

struct SynthDatasetSpec {
  uint64_t samples = 0;
  uint64_t min_len = 1;  // tokens
  uint64_t max_len = 1;  // inclusive
  uint64_t vocab = 2;    // tokens are in [0, vocab)
  uint64_t seed = 0;
};

// u16 (code 8) when the vocabulary fits, else i32 (code 4).
uint8_t SynthDTypeCode(const SynthDatasetSpec& spec);
// Length and tokens of sample i.
uint64_t SynthLength(const SynthDatasetSpec& spec, uint64_t i);
std::vector<int64_t> SynthTokens(const SynthDatasetSpec& spec, uint64_t i);

// \error InvalidArgument when samples is 0, min_len > max_len, max_len >= 2^31,
//        vocab < 1 or vocab > 2^31.
Status CheckSynthSpec(const SynthDatasetSpec& spec);

// Writes PREFIX.bin and PREFIX.idx (streaming). `progress` gets .bin bytes written.
// \error as CheckSynthSpec; IOError from the Env.
Status WriteSynthDataset(Env* env, const SynthDatasetSpec& spec, const std::string& prefix,
                         const std::function<void(uint64_t)>& progress = {});

}  // namespace ptc
