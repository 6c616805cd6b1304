// The parallel configuration of a job: mesh degrees, ZeRO stage, pipeline
// layer split and placement of ranks on workers.
//
// Written as "tp=2,pp=2,dp=1" with optional "cp=2", "ep=4", "etp=1",
// "zero=1", "pp_layers=5+6+6+7", "per_worker=8", "workers=0+2+3" and
// "replicas=2". Rank order is Megatron-Core's (parallel_state.RankGenerator,
// order "tp-cp-ep-dp-pp"), two grids over the same ranks:
//   dense:  tp fastest, then cp, then dp, then pp (ep=1 in this grid)
//     rank = ((pp_idx*dp + dp_idx)*cp + cp_idx)*tp + tp_idx
//   expert: etp fastest, then ep, then edp, then pp, where
//     edp = tp*cp*dp / (etp*ep) (tp*cp*dp must be a multiple of etp*ep)
//     rank = ((pp_idx*edp + edp_idx)*ep + ep_idx)*etp + etp_idx
// Without cp, ep and etp this is Megatron's tp-dp-pp order. cp (context
// parallelism) replicates the weights like dp; ep places whole experts (ep
// rank r holds experts [r*E/ep, (r+1)*E/ep)); etp splits each expert's
// matrices as tp splits a dense MLP (default: etp = tp, as Megatron-Core's
// expert_tensor_parallel_size defaults). ZeRO-1 cuts the dense parameters'
// optimizer state over the dp x cp group and the experts' over the edp group,
// as Megatron-Core's distributed optimizer does.
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
  int cp = 0;
  // The expert grid (ParallelConfig above).
  int etp = 0;
  int ep = 0;
  int edp = 0;
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
  int cp = 1;                  // context parallelism: replicas of the weights, like dp
  int ep = 1;                  // expert parallelism: whole experts per rank
  int etp = 0;                 // expert tensor parallelism; 0: the same as tp

  int world_size() const { return tp * cp * dp * pp; }
  int expert_tp() const { return etp ? etp : tp; }
  // The expert data-parallel degree: ranks of a stage holding the same expert shard.
  int expert_dp() const { return tp * cp * dp / (expert_tp() * ep); }
  // Ranks a dense parameter's ZeRO-1 state is cut over (Megatron's dp x cp group),
  // and this rank's index in that group.
  int dense_zero_ranks() const { return dp * cp; }
  static int DenseZeroIndex(const RankCoords& c, int cp) { return c.dp * cp + c.cp; }
  // Slots: workers holding ranks.
  int num_workers() const { return (world_size() + per_worker - 1) / per_worker; }
  RankCoords CoordsOf(int rank) const;
  // The rank of dense coordinates (tp, cp, dp, pp; the expert ones follow from them).
  int RankOf(const RankCoords& c) const { return ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp; }
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

// Parses "tp=2,pp=2,dp=1[,cp=C][,ep=E][,etp=T][,zero=1][,pp_layers=a+b+...]
// [,per_worker=N][,workers=a+b+...][,replicas=R]". Keys may come in any order;
// missing degrees default to 1 (etp: to tp). A placement that is the default
// (0+1+...) is dropped, and so is an etp equal to tp.
// \error InvalidArgument naming the offending key or value: unknown key,
//   non-positive degree, zero not 0 or 1, pp_layers with a count other than pp,
//   workers with a count other than the slots or a worker twice, replicas
//   above the slots; as CheckExpertGrid.
Result<ParallelConfig> ParseConfig(std::string_view text);

// The expert grid's rule: etp*ep divides tp*cp*dp (each pipeline stage's ranks
// form the expert grid etp x ep x edp).
// \error InvalidArgument naming the rule and the numbers.
Status CheckExpertGrid(const ParallelConfig& config);

}  // namespace ptc
