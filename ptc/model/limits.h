// The limits every command and the mount check a model and a parallel config
// against, up front, before anything is allocated for them: a text a client
// writes (a config, dims, a manifest) must never make a process allocate or
// write without bound (issue 24). Each limit is generous for real jobs and
// small enough that what a process builds for a config at the limit fits in
// memory. Errors are InvalidArgument (the CLI's exit 2), one line naming the
// limit and the value.
//
// Values and pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ptc/base/status.h"
#include "ptc/model/view.h"

namespace ptc {

// Ranks of one config (tp*pp*dp). Every rank has a view, files and a place in a plan.
inline constexpr int64_t kMaxRanks = 65536;
// Layers of a model (dims layers=): each adds a tensor per layer rule.
inline constexpr Index kMaxLayers = 16384;
// Routed experts of one MoE layer (dims experts=); each adds a tensor per expert rule.
inline constexpr Index kMaxExperts = 16384;
// Global tensors of a model, optimizer state included (4 per parameter with Adam).
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
// Bytes of one global tensor (1 TiB); the largest of real models are tens of GiB.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;
// Bytes of all global tensors of a model (64 TiB): a checkpoint of kMaxRanks
// ranks holding all of it each still counts in 64 bits.
inline constexpr uint64_t kMaxModelBytes = uint64_t{1} << 46;
// Local tensors of a layout: ranks x local tensors per rank. A mount serving
// every rank keeps a view of each, a rewrite its shard records (about 2.5 KiB per
// local tensor in all, measured): this keeps the daemon within about 1.3 GiB.
inline constexpr uint64_t kMaxLayoutTensors = uint64_t{1} << 19;
// Files one export or synth writes (ranks x files per rank; with npy a file per
// local tensor, so also bounded by kMaxLayoutTensors while that is lower).
inline constexpr uint64_t kMaxFilesWritten = uint64_t{1} << 20;

// `text` for a message: at most `max` bytes, the rest counted.
std::string CutForMessage(std::string_view text, size_t max = 120);

// What a model and a layout amount to, computed from the schema's rules
// without expanding the layers (cheap enough for every ValidateConfig).
struct LayoutSize {
  uint64_t tensors = 0;           // global tensors, optimizer state included
  uint64_t largest_tensor = 0;    // bytes of the largest global tensor
  std::string largest_name;       // its rule
  uint64_t model_bytes = 0;       // bytes of all global tensors
};

// \error InvalidArgument naming the rule whose shape formula fails or
//   overflows, kMaxTensors, kMaxTensorBytes or kMaxModelBytes with the value.
Result<LayoutSize> CheckModelLimits(const ModelSpec& spec);

// The ranks of `config`, CheckModelLimits, then the local tensors of the
// layout (ranks x the local tensors of the fullest rank, an upper bound).
// \error InvalidArgument naming kMaxRanks or kMaxLayoutTensors with the value;
//   as CheckModelLimits.
Status CheckLayoutLimits(const ModelSpec& spec, const ParallelConfig& config);

// \error InvalidArgument naming kMaxFilesWritten when `files` exceeds it.
Status CheckFilesWritten(uint64_t files, const std::string& what);

// `what` holds `bytes` in memory at once; the machine has `memory` (Env::MemoryBytes, 0: unknown).
// \error InvalidArgument naming both when bytes exceed memory.
Status CheckHeldBytes(uint64_t bytes, uint64_t memory, const std::string& what);

}  // namespace ptc
