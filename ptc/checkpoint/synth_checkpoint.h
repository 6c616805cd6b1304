// `ptcfs synth`: a per-rank checkpoint of synthetic values (see synth.h).
#pragma once

#include <cstdint>
#include <string>

#include "ptc/checkpoint/checkpoint.h"

namespace ptc {

// Writes DIR/rank-RRRRR/{model,optim}.safetensors for every rank of config.
// \error as ValidateConfig and WriteRankCheckpoint.
Status WriteSynthCheckpoint(Env* env, const ModelSpec& spec, const ParallelConfig& config, uint64_t seed,
                            const std::string& dir, const ProgressFn& progress = {});

// Total bytes of tensor data the checkpoint of `config` holds (for progress bars).
Result<uint64_t> CheckpointBytes(const ModelSpec& spec, const ParallelConfig& config);

}  // namespace ptc
