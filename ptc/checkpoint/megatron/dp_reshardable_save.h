// Taking a torch_dist save of Megatron-Core's DistributedOptimizer in its
// dp_reshardable form (dist_optimizer.h; docs/megatron_format.md, "The
// distributed optimizer in torch_dist"): each bucket state back into the
// store's optimizer tensors (P.fp32, P.exp_avg, P.exp_avg_sq), and the
// ShardedObjects (groups, step, bucket sizes) checked against the layout.
//
// A bucket state is a flat float32 tensor; each parameter's slot in it is the
// parameter's local shard (a box of the global tensor, or a few for fused
// [gate; up] shards) row-major. So a run of the bucket's elements is, per
// segment it meets, at most 2*rank-1 boxes of the global tensor, each a
// contiguous run of the bucket (BucketRuns): the saved chunk's bytes
// themselves, with no transposition.
//
// Thread safety: pure functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/format/pickle.h"
#include "ptc/model/box.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

// The bucket states a save is read by: `layout`'s, each segment (global
// tensor and box) kept in the first bucket that holds it only. A parameter
// replicated over tp (a norm) has its state in every tp domain's bucket;
// one copy is read, the others passed over.
std::vector<LocalTensor> SavedBucketStates(const DpReshardableLayout& layout);

// Elements [at, at + box.volume()) of a bucket hold `box` of `tensor`, row-major.
struct BucketRun {
  std::string tensor;
  Box box;
  Index at = 0;
  friend bool operator==(const BucketRun&, const BucketRun&) = default;
};

// What elements [begin, end) of `bucket` (a SavedBucketStates tensor) hold,
// in the bucket's order; the gaps between parameters give none.
std::vector<BucketRun> BucketRuns(const LocalTensor& bucket, Index begin, Index end);

// The value of a save's ShardedObject `key` ("...optimizer/shard_0_1"):
// nullopt when the file holding it is not at hand (another worker's part of
// a save taken on many). \error naming the key when the save lacks it or its
// bytes do not read.
using SavedObjectFn = std::function<Result<std::optional<pickle::Value>>(const std::string& key)>;

// The save's objects checked against `layout` (every domain's whose file is
// at hand; the first dense and the first expert domain's must be), and
// common.pt's 'optimizer' entry that ReadMcoreOptimizerCommon reads made of
// them: {'param_groups': [the groups without 'step'], 'state': {'common_step':
// the step}} of the first dense domain (ChainedOptimizer: {0: that, 1: the
// same of the first expert domain}); no 'state' when the groups have no step.
// \error InvalidArgument naming the key: a per_bucket_numel or
//        per_bucket_numel_unpadded other than the layout's (naming the bucket
//        and both sizes: `config` says which layout), an optimizer object
//        without a list of dict groups, a step that is no number, steps that
//        differ; as `object`.
Result<pickle::Value> DpReshardableSavedCommon(const DpReshardableLayout& layout, const SavedObjectFn& object,
                                               const std::string& config, const std::string& what);

}  // namespace ptc::megatron
