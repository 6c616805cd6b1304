#include "ptc/checkpoint/megatron/ddp_buffer.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace ptc::megatron {
namespace {

constexpr Index kMaxBuffer = Index{1} << 60;
constexpr Index kParamAlign = 64;  // _pad_start_of_param_if_needed: 128-byte aligned at >= 16 bits

Index RoundUp(Index n, Index divisor) { return (n + divisor - 1) / divisor * divisor; }

// The buffer as _ParamAndGradBuffer.__init__ builds it, one parameter at a time.
class Builder {
 public:
  Builder(const DdpOptions& options)
      : options_(options),
        bucket_divisor_(std::lcm(std::lcm(Index{options.dp}, Index{128}),
                                 options.pad_for_high_nccl_busbw ? Index{65536} : Index{1})) {}

  void Add(size_t index, const DdpParam& param) {
    Index start = RoundUp(next_, kParamAlign);
    if (param.shared_embedding && in_bucket_ > 0) start = CloseBucket(start);
    const Index end = start + param.numel;
    buffer_.slots.push_back({index, start, end, static_cast<int>(buffer_.buckets.size())});
    ++in_bucket_;
    const bool full = options_.bucket_size > 0 && end - bucket_start_ >= options_.bucket_size;
    next_ = full || param.shared_embedding ? CloseBucket(end) : end;
  }

  DdpBuffer Finish() && {
    if (in_bucket_ > 0) CloseBucket(buffer_.slots.back().end);
    return std::move(buffer_);
  }

 private:
  // _update_bucket_metadata: the bucket ends at `param_end`, padded; returns its padded end.
  Index CloseBucket(Index param_end) {
    const Index end = RoundUp(param_end, bucket_divisor_);
    buffer_.buckets.push_back({bucket_start_, end - bucket_start_, param_end - bucket_start_});
    bucket_start_ = end;
    in_bucket_ = 0;
    return end;
  }

  const DdpOptions options_;
  const Index bucket_divisor_;
  DdpBuffer buffer_;
  Index next_ = 0;  // where the next parameter may start (before its alignment)
  Index bucket_start_ = 0;
  size_t in_bucket_ = 0;
};

}  // namespace

Result<DdpBuffer> LayOutDdpBuffer(std::span<const DdpParam> params, const DdpOptions& options) {
  if (options.dp < 1) {
    return InvalidArgumentError("DDP buffer: dp " + std::to_string(options.dp) + " < 1");
  }
  if (options.bucket_size < 0) {
    return InvalidArgumentError("DDP buffer: bucket size " + std::to_string(options.bucket_size) + " < 0");
  }
  Index total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel < 0 || params[i].numel > kMaxBuffer) {
      return InvalidArgumentError("DDP buffer: parameter " + std::to_string(i) + " has " +
                                  std::to_string(params[i].numel) + " elements");
    }
    // Each parameter adds at most its size, 63 of alignment and a bucket's padding.
    total += params[i].numel + kParamAlign + std::lcm(Index{options.dp}, Index{1} << 16);
    if (total > kMaxBuffer) return InvalidArgumentError("DDP buffer: more than 2^60 elements");
  }
  Builder builder(options);
  for (size_t i = params.size(); i-- > 0;) builder.Add(i, params[i]);
  return std::move(builder).Finish();
}

std::vector<DdpPiece> DdpRankPieces(const DdpBuffer& buffer, size_t bucket, int rank, int dp) {
  const DdpBucket& b = buffer.buckets[bucket];
  const Index local = b.numel / dp;
  const Index first = b.offset + rank * local;  // the rank's piece in the buffer
  std::vector<DdpPiece> parts;
  for (const DdpSlot& slot : buffer.slots) {
    const Index lo = std::max(slot.start, first), hi = std::min(slot.end, first + local);
    if (slot.bucket != static_cast<int>(bucket) || hi <= lo) continue;
    parts.push_back({slot.param, lo - slot.start, hi - slot.start, lo - b.offset});
  }
  // The gaps (sharded_param_state_dp_reshardable): before each part, and after
  // the last up to the piece's end, where they start before the unpadded end.
  std::vector<DdpPiece> pieces;
  Index at = rank * local;
  for (size_t i = 0; i <= parts.size(); ++i) {
    const Index next = i < parts.size() ? parts[i].at : (rank + 1) * local;
    if (next > at && at < b.numel_unpadded) pieces.push_back({kDdpPadding, at, next, at});
    if (i < parts.size()) {
      pieces.push_back(parts[i]);
      at = parts[i].at + (parts[i].end - parts[i].begin);
    }
  }
  return pieces;
}

}  // namespace ptc::megatron
