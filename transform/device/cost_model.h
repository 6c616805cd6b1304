// The cost model of per-length-group strategies (HotSPa): for a model, a GPU
// count, device memory and the dataset's length buckets, the (dp, tp, pp) each
// bucket trains in, the order of the switches in an iteration, and the
// predicted time per iteration against the best single strategy.
// docs/switching.md states the assumptions; in short, per GPU:
//   memory   = 4 P / (tp pp)                  bf16 weights + grads, current layout
//            + 12 P / N                       fp32 master + Adam, base layout (sharded over all N)
//            + 34 s h L / tp * min(m, pp)/pp  activations (flash attention, sequence parallel,
//                                             1F1B: stage 0 holds min(m, pp) micro-batches)
//            + 4 s V / tp                     fp32 logits of one sequence (last stage)
//   must stay within (1 - reserve) * device memory for the longest sequence of the bucket;
//   compute  = (6 P s + 6 L h s^2) flops per sequence of s tokens (causal attention),
//              at mfu * peak per GPU;
//   tp comm  = 8 L s h 2 (tp-1)/tp bytes per sequence (4 all-reduces per layer) over the link,
//              plus a fixed latency per all-reduce;
//   pipeline = (m + pp - 1) stage times for m micro-batches (one sequence each) per replica;
//   switch   = bytes the most loaded rank sends or receives, from the real switch plan
//              (parameters and gradients, bf16), over the link, plus a fixed latency;
//   gradient sync and optimizer step: the same for every strategy (reduce-scatter in the base layout).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/view.h"

namespace ptc::transform::device {

struct Hardware {
  int gpus = 8;
  int gpus_per_node = 8;         // tp and switches stay inside a node
  double memory_bytes = 141e9;   // per GPU (H200)
  double reserve = 0.10;         // of memory kept for the allocator, workspaces, NCCL
  double peak_flops = 989e12;    // dense bf16 per GPU (H100/H200 SXM)
  double mfu = 0.5;              // fraction of peak the matmuls reach
  double link_bytes_per_s = 450e9;  // per GPU per direction inside a node (NVLink 4)
  double switch_latency_s = 2e-3;   // per switch: launches, NCCL group setup
  double collective_latency_s = 30e-6;  // per tp all-reduce, whatever its size
};

// One length group of a global batch.
struct LengthBucket {
  uint64_t max_len = 0;      // the bucket's bound: memory must hold a sequence this long
  double sequences = 0;      // per global batch
  double mean_len = 0;       // tokens
  double mean_sq_len = 0;    // tokens^2 (attention)
};

// The model's sizes the estimates use (from its global tensors).
struct ModelStats {
  double params = 0;  // all parameters
  double layers = 0, hidden = 0, vocab = 0;
};
// \error InvalidArgument as GlobalTensors.
Result<ModelStats> StatsOf(const ModelSpec& spec);

struct Estimate {
  bool fits = false;
  double memory_bytes = 0;  // per GPU, at the bucket's longest sequence
  double seconds = 0;       // the bucket's share of an iteration
};
Estimate EstimateBucket(const ModelStats& m, const Hardware& hw, const ParallelConfig& c, const LengthBucket& b);

// Every (dp, tp, pp) with dp tp pp = gpus that partitions the model (ValidateConfig), tp within a node.
std::vector<ParallelConfig> CandidateConfigs(const ModelSpec& spec, const Hardware& hw);

struct SwitchStep {
  ParallelConfig from, to;
  uint64_t bytes = 0;  // the most loaded rank's send or receive bytes
  double seconds = 0;
};

struct StrategyReport {
  std::vector<ParallelConfig> chosen;     // per bucket
  std::vector<Estimate> chosen_estimate;  // per bucket
  ParallelConfig fixed;                   // the best single strategy (fits every bucket)
  std::vector<Estimate> fixed_estimate;   // per bucket
  ParallelConfig base;                    // where parameters and gradients start and end an iteration
  std::vector<size_t> order;              // buckets in the order they train
  std::vector<SwitchStep> switches;       // base -> ... -> base; same-layout steps left out
  double grad_sync_seconds = 0;           // the same for both
  double switching_seconds = 0;           // per iteration: buckets + switches + grad sync
  double fixed_seconds = 0;               // per iteration with `fixed`
  double speedup() const { return switching_seconds > 0 ? fixed_seconds / switching_seconds : 0; }
};

// \error InvalidArgument when no strategy fits a bucket in memory (naming the
//   bucket and the smallest memory need), when there are no buckets, or when
//   the GPU count admits no config of the model; as MakeSwitchPlan.
// `fixed`, when given, is the single strategy to compare with (else the best one that fits every bucket).
// \error also InvalidArgument when `fixed` does not partition the model over hw.gpus or does not fit a bucket.
Result<StrategyReport> PlanStrategies(const ModelSpec& spec, const Hardware& hw, const std::vector<LengthBucket>& buckets,
                                      const ParallelConfig* fixed = nullptr);

// Buckets from bounds and the share of sequences in each, lengths uniform
// between the previous bound (exclusive) and this one.
std::vector<LengthBucket> UniformBuckets(const std::vector<uint64_t>& bounds, const std::vector<double>& shares,
                                         double global_batch);

}  // namespace ptc::transform::device
