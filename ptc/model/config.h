// The parallel configuration of a job: mesh degrees, ZeRO stage, pipeline
// layer split and placement of ranks on workers.
//
// Written as "tp=2,pp=2,dp=1" with optional "zero=1", "pp_layers=5+6+6+7" and
// "per_worker=8". Rank order is Megatron's: tp fastest, then dp, then pp:
//   rank = pp_idx*(dp*tp) + dp_idx*tp + tp_idx
// Worker w holds ranks [w*per_worker, (w+1)*per_worker); the last worker may
// hold fewer.
//
// Values; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"

namespace ptc {

struct RankCoords {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  friend bool operator==(const RankCoords&, const RankCoords&) = default;
};

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int zero = 0;                // 0: optimizer state partitioned like the parameters; 1: ZeRO-1 flat buffers
  std::vector<int> pp_layers;  // layers per stage; empty = even split
  int per_worker = 8;          // ranks per worker

  int world_size() const { return tp * pp * dp; }
  int num_workers() const { return (world_size() + per_worker - 1) / per_worker; }
  RankCoords CoordsOf(int rank) const;
  int RankOf(const RankCoords& c) const { return c.pp * dp * tp + c.dp * tp + c.tp; }
  int WorkerOf(int rank) const { return rank / per_worker; }
  // Canonical text; ParseConfig(ToString()) gives back the same config.
  std::string ToString() const;

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Parses "tp=2,pp=2,dp=1[,zero=1][,pp_layers=a+b+...][,per_worker=N]".
// Keys may come in any order; missing degrees default to 1.
// \error InvalidArgument naming the offending key or value: unknown key,
//   non-positive degree, zero not 0 or 1, pp_layers with a count other than pp.
Result<ParallelConfig> ParseConfig(std::string_view text);

}  // namespace ptc
