// What a job's committed generation says about its workers (docs/cluster.md,
// "Lost workers"), shared by `ptcfs cluster status` and the "cluster" part of
// a cluster mount's .ptcfs/status: the pieces each worker holds, the copies
// other workers hold of them, and what losing a worker would cost. Pure
// functions over metadata (the cost is a plan).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/model/config.h"
#include "ptc/store/manifest.h"
#include "ptc/store/model_spec.h"

namespace ptcfs::worker {

struct WorkerPieces {
  uint64_t pieces = 0;
  uint64_t bytes = 0;
  std::map<int, uint64_t> copies;  // other worker -> bytes of these pieces it holds too
};

// Every worker holding pieces of `m`.
std::map<int, WorkerPieces> PiecesByWorker(const ptc::GenerationManifest& m);

// {"pieces", "bytes", "replicas": {"W": bytes}} of `p` (docs/cli.md).
nlohmann::json PiecesJson(const WorkerPieces& p);

// What losing `worker` would cost `m` (config `config`) with `live` (sorted)
// the workers live now (docs/cli.md, "if_lost"): the survivors' config and
// the bytes its plan moves, the tensors no survivor holds a part of, and,
// with the durable tier's copy (`durable`, or null), the bytes read from it.
nlohmann::json IfLost(const ptc::GenerationManifest& m, const ptc::ModelSpec& spec, const ptc::ParallelConfig& config,
                      const std::vector<int>& live, int worker, const std::vector<ptc::ShardRecord>* durable);

}  // namespace ptcfs::worker
