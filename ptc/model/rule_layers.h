// Where a schema rule has tensors: on which layers (all, dense, MoE), for
// which experts, and whether its "when" formula holds for the model dims.
// A dense model (experts=0) has no MoE layer, so its MoE rules have no tensor.
//
// Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <utility>

#include "ptc/base/status.h"
#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"

namespace ptc {

// Whether `rule`'s "when" holds (an empty one always does).
// \error InvalidArgument naming the rule whose "when" formula fails.
Result<bool> RuleWhen(const TensorRule& rule, const ModelDims& dims);

// Whether a per-layer `rule` (whose "when" holds) has a tensor on `layer`.
bool RuleOnLayer(const TensorRule& rule, const ModelDims& dims, Index layer);

// The global tensors of `rule`: 1 for a first/last rule, the layers it is on
// (times the experts for an expert rule), 0 when its "when" does not hold.
// \error as RuleWhen.
Result<uint64_t> RuleTensors(const TensorRule& rule, const ModelDims& dims);

// The experts ep rank `ep_rank` holds: [first, first + count).
// REQUIRES: config.ep divides dims.experts.
std::pair<Index, Index> RankExperts(const ModelDims& dims, const ParallelConfig& config, int ep_rank);

}  // namespace ptc
