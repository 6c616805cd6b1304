// What a job that lost workers moves to (docs/cluster.md, "Lost workers").
// Pure functions: every survivor computes the same answer from the same
// committed config and live members.
//
// Thread safety: pure functions.
#pragma once

#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/config.h"
#include "ptc/model/view.h"

namespace ptc::cluster {

// The workers of `config` (those holding ranks or keeping replicas) that are
// not in `live` (sorted).
std::vector<int> LostWorkers(const ParallelConfig& config, const std::vector<int>& live);

// The config for the surviving workers `live` (sorted, distinct) after
// `from` lost some: the same tp, cp, etp, zero and per_worker; the pipeline,
// data and expert degrees refitted to the GPUs left: the most ranks that fit
// on the survivors (per_worker each) and that the model allows, then the pp
// closest to from's (its pp_layers kept when pp is), then the ep closest to
// from's (whole experts: as few moved as the new grid allows); the first
// survivors as its workers; replicas as from's, at most one per survivor
// holding ranks.
// \error FailedPrecondition naming tp (cp, etp) and the survivors when no
//        config fits (fewer survivors' GPUs than tp*cp, or no pipeline split
//        or expert grid the model allows).
Result<ParallelConfig> SurvivorConfig(const ModelSpec& spec, const ParallelConfig& from, const std::vector<int>& live);

}  // namespace ptc::cluster
