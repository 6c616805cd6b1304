// `ptcfs synth`: a per-rank checkpoint of synthetic values (see synth.h).
#pragma once

#include <cstdint>
#include <string>

#include "ptc/checkpoint/checkpoint.h"

namespace ptc {

// Writes DIR/rank-RRRRR/{model,optim}.safetensors for every rank of the layout.
// \error as CheckCheckpointWrite and WriteRankCheckpoint.
Status WriteSynthCheckpoint(Env* env, const ModelLayout& layout, uint64_t seed, const std::string& dir,
                            const ProgressFn& progress = {});

// Total bytes of tensor data the layout's checkpoint holds (for progress bars).
Result<uint64_t> CheckpointBytes(const ModelLayout& layout);

}  // namespace ptc
