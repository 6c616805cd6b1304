// The parallel configuration of a job: mesh degrees, ZeRO stage, pipeline
// layer split and placement of ranks on workers.
//
// Written as "tp=2,pp=2,dp=1" with optional "zero=1", "pp_layers=5+6+6+7",
// "per_worker=8", "workers=0+2+3" and "replicas=2". Rank order is Megatron's:
// tp fastest, then dp, then pp:
//   rank = pp_idx*(dp*tp) + dp_idx*tp + tp_idx
// Slot s holds ranks [s*per_worker, (s+1)*per_worker) (the last may hold
// fewer); slot s runs on worker s, or on workers[s] when the placement is
// given (a job that lost workers runs on the others). With replicas R every
// stored piece of slot s is also kept by the workers of the next R-1 slots
// (cyclically), so that losing fewer than R workers loses nothing.
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
  std::vector<int> workers;    // the worker of each slot; empty: slot s is worker s
  int replicas = 1;            // workers keeping each stored piece (<= num_workers())

  int world_size() const { return tp * pp * dp; }
  // Slots: workers holding ranks.
  int num_workers() const { return (world_size() + per_worker - 1) / per_worker; }
  RankCoords CoordsOf(int rank) const;
  int RankOf(const RankCoords& c) const { return c.pp * dp * tp + c.dp * tp + c.tp; }
  int WorkerOfSlot(int slot) const { return workers.empty() ? slot : workers[slot]; }
  int WorkerOf(int rank) const { return WorkerOfSlot(rank / per_worker); }
  // The workers holding ranks, in slot order.
  std::vector<int> Workers() const;
  // Clears `workers` when it is the default placement (slot s on worker s),
  // so that a placement is written one way.
  void DropDefaultPlacement();
  bool HoldsRanks(int worker) const;
  // The workers keeping the stored pieces of `slot`: its own, then the next
  // replicas-1 slots' (cyclically).
  std::vector<int> KeepersOfSlot(int slot) const;
  // Canonical text; ParseConfig(ToString()) gives back the same config.
  std::string ToString() const;

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// The workers holding ranks, "0, 2, 3", for messages.
std::string WorkersText(const ParallelConfig& config);

// Parses "tp=2,pp=2,dp=1[,zero=1][,pp_layers=a+b+...][,per_worker=N]
// [,workers=a+b+...][,replicas=R]". Keys may come in any order; missing
// degrees default to 1. A placement that is the default (0+1+...) is dropped.
// \error InvalidArgument naming the offending key or value: unknown key,
//   non-positive degree, zero not 0 or 1, pp_layers with a count other than pp,
//   workers with a count other than the slots or a worker twice, replicas
//   above the slots.
Result<ParallelConfig> ParseConfig(std::string_view text);

}  // namespace ptc
