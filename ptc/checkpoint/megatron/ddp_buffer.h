// Megatron-Core's gradient buffer under its distributed optimizer
// (megatron-core 0.16.1: distributed/param_and_grad_buffer.py,
// _ParamAndGradBuffer.__init__ with use_distributed_optimizer) and the part of
// each bucket a data-parallel rank owns (optimizer/distrib_optimizer.py,
// _build_model_gbuf_range and sharded_param_state_dp_reshardable's padding):
// the layout the distributed optimizer's torch_dist forms key its state by
// (docs/megatron_format.md, "The distributed optimizer in torch_dist").
//
// The rules, on the parameters of one buffer in registration order:
//   - they are laid out reversed (the last registered first);
//   - each starts at a multiple of 64 elements;
//   - with a bucket size B, a bucket closes after the parameter that ends at
//     least B elements past the bucket's start; a shared embedding closes the
//     bucket before it (when that has parameters) and its own after it;
//   - a bucket's unpadded size ends at its last parameter's end; its end is
//     padded to a multiple of lcm(dp, 128) (lcm(dp, 128, 65536) for high NCCL
//     bus bandwidth), where the next bucket starts.
// A bucket of padded size N is cut into dp pieces of N/dp; rank r owns
// [r*N/dp, (r+1)*N/dp) of it.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/box.h"

namespace ptc::megatron {

// A parameter of the buffer, in registration order (named_parameters()).
struct DdpParam {
  Index numel = 0;
  bool shared_embedding = false;  // Megatron's param.shared_embedding (tied embeddings at pp > 1)
};

struct DdpOptions {
  int dp = 1;             // the buffer's data-parallel group: dp*cp (dense), edp (experts)
  Index bucket_size = 0;  // 0: one bucket (overlap_grad_reduce off: Megatron-LM's default)
  bool pad_for_high_nccl_busbw = false;
};

// Where a parameter is: [start, end) of the buffer, in bucket `bucket`.
struct DdpSlot {
  size_t param = 0;  // index into the parameters given
  Index start = 0, end = 0;
  int bucket = 0;
  friend bool operator==(const DdpSlot&, const DdpSlot&) = default;
};

struct DdpBucket {
  Index offset = 0;          // of its first element in the buffer
  Index numel = 0;           // padded
  Index numel_unpadded = 0;  // to its last parameter's end
  friend bool operator==(const DdpBucket&, const DdpBucket&) = default;
};

struct DdpBuffer {
  std::vector<DdpSlot> slots;  // in buffer order (registration order reversed)
  std::vector<DdpBucket> buckets;
};

// The buffer of `params` (registration order).
// \error InvalidArgument naming the rule: dp < 1, a negative bucket size, a
//        parameter of negative size (naming its index), a buffer past 2^60 elements.
Result<DdpBuffer> LayOutDdpBuffer(std::span<const DdpParam> params, const DdpOptions& options);

// A run of a bucket's elements a rank owns: parameter `param`'s flat elements
// [begin, end) at `at` (relative to the bucket's start), or a gap between
// parameters (param == kDdpPadding, [begin, end) == [at, at + size)).
inline constexpr size_t kDdpPadding = std::numeric_limits<size_t>::max();
struct DdpPiece {
  size_t param = kDdpPadding;
  Index begin = 0, end = 0;
  Index at = 0;
  friend bool operator==(const DdpPiece&, const DdpPiece&) = default;
};

// What dp rank `rank` holds of bucket `bucket` (of a buffer laid out with
// `dp`), in bucket order: each parameter's part inside the rank's piece, and
// the gaps between them that start before the bucket's unpadded end (the
// ShardedTensors dp_reshardable writes; the parameters' parts are the
// flattened ranges fully_sharded_model_space keys). Over every rank they
// tile [0, numel_unpadded) of the bucket.
// REQUIRES: bucket < buffer.buckets.size(), 0 <= rank < dp, dp the layout's.
std::vector<DdpPiece> DdpRankPieces(const DdpBuffer& buffer, size_t bucket, int rank, int dp);

}  // namespace ptc::megatron
