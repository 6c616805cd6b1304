// Switch plans: moving device-resident training state between two parallel
// layouts of the same job (HotSPa's hot switching), as a schedule per rank
// that any executor runs: the CPU executor (cpu_executor.h), the CUDA/NCCL
// executor (cuda_executor.h), or a caller's own transport through the C API
// (switch_c_api.h).
//
// What moves (SwitchContents): the parameters' working copies (bf16 by
// default) and the accumulated gradients, which have the parameters' layout;
// fp32 master weights and Adam state stay in the base layout unless asked for.
//
// The plan reuses the repartitioning planner (plan.h) with every rank as a
// worker of its own: a rank's own pieces are copied locally first; the rest
// comes from the replica on the same host, then the least loaded sender so
// far, then the lowest rank. Each piece is then cut into strided copies:
//   local:   layout-A buffer -> layout-B buffer on the same rank, directly;
//   remote:  pack (A buffer -> staging) on the sender, one message per peer
//            and bucket, unpack (staging -> B buffer) on the receiver.
// Pieces are split and grouped into buckets so that one bucket's staging
// (its sends and receives together) stays within the memory budget on every
// rank. Every rank has the same number of buckets; bucket b of all ranks runs
// together (one grouped exchange).
//
// A rank's buffers, in order: its parameters (the view's model tensors, a
// schema's "buffer" tensors among them), then the parameters' gradients (the
// same tensors with ".grad" appended to the name; a model buffer has none), then
// its optimizer tensors (the view's optim list) when they move.
//
// Thread safety: MakeSwitchPlan is pure; SwitchPlanCache is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"
#include "transform/device/strided_copy.h"

namespace ptc::transform::device {

struct SwitchContents {
  DType param_dtype = DType::kBF16;  // the working copies
  bool grads = true;
  DType grad_dtype = DType::kBF16;
  bool optimizer = false;  // fp32 master weights and Adam state (a base-layout change, not a hot switch)
};

struct SwitchRequest {
  ModelSpec spec;  // schema and dims; spec.dtype and spec.optimizer are ignored (contents decides)
  ParallelConfig from;
  ParallelConfig to;
  SwitchContents contents;
  int ranks_per_host = 8;              // ranks r and s share a host when r / ranks_per_host == s / ranks_per_host
  uint64_t budget_bytes = 64ull << 20;  // staging memory per rank for one bucket (sends + receives)
};

inline constexpr uint64_t kStagingAlign = 16;  // every piece starts 16-byte aligned in staging

// A message of one bucket: bytes [offset, offset + bytes) of the staging buffer.
struct PeerSpan {
  int peer = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct SwitchBucket {
  std::vector<StridedCopy> pack;    // A buffer -> staging, before the exchange
  std::vector<PeerSpan> sends;      // ascending peer
  std::vector<PeerSpan> recvs;      // ascending peer, after the sends in staging
  std::vector<StridedCopy> unpack;  // staging -> B buffer, after the exchange
  uint64_t staging_bytes = 0;       // end of the last receive
};

struct RankSchedule {
  std::vector<LocalTensor> from;     // the rank's buffers in layout A (empty when outside A's world)
  std::vector<LocalTensor> to;       // and in layout B
  std::vector<StridedCopy> local;    // A -> B on this rank
  std::vector<SwitchBucket> buckets;  // as many as the plan has
  uint64_t bytes_local = 0;          // payload copied locally
  uint64_t bytes_sent = 0;           // message bytes (payload and alignment padding)
  uint64_t bytes_received = 0;
  uint64_t staging_bytes = 0;  // max over buckets: the extra memory the rank needs
};

struct SwitchPlan {
  int world = 0;  // max of the two layouts' world sizes
  std::vector<RankSchedule> ranks;
  size_t num_buckets = 0;
  std::map<std::pair<int, int>, uint64_t> messages;  // (sender, receiver) -> payload bytes, all buckets
  uint64_t bytes_total = 0;  // payload of every target buffer's segments
  uint64_t bytes_local = 0;  // payload copied inside ranks
  uint64_t bytes_moved = 0;  // payload sent between ranks
  uint64_t bottleneck = 0;   // max over ranks of message bytes sent or received
};

// Bytes of a buffer: NumElements(shape) * DTypeSize(dtype).
uint64_t BufferBytes(const LocalTensor& t);

// The layout of `config` with the spec's dtype and optimizer state as
// `contents` holds them.
// \error as ModelLayout::Make.
Result<ModelLayout> SwitchLayout(ModelSpec spec, const ParallelConfig& config, const SwitchContents& contents);

// The buffers a rank holds in a SwitchLayout (the order above); empty outside its world.
// \error as ModelLayout::View.
Result<std::vector<LocalTensor>> SwitchBuffers(const ModelLayout& layout, int rank, const SwitchContents& contents);

// \error InvalidArgument when either config does not partition the model
//   (as ValidateConfig, naming the layout), when the budget is below 64
//   bytes, or when a copy needs more than kMaxCopyDims strided dimensions;
//   Internal when the planner leaves a region uncovered.
Result<SwitchPlan> MakeSwitchPlan(const SwitchRequest& request);

// The cache key of a request: schema, dims, both layouts, contents, topology, budget.
std::string SwitchKey(const SwitchRequest& request);

// Plans cached per (layout A, layout B) and the rest of the key.
class SwitchPlanCache {
 public:
  // \error as MakeSwitchPlan (failures are not cached).
  Result<std::shared_ptr<const SwitchPlan>> Get(const SwitchRequest& request);
  size_t size() const;
  uint64_t hits() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const SwitchPlan>> plans_;
  uint64_t hits_ = 0;
};

}  // namespace ptc::transform::device
