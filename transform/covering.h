// What a new generation is made of: the source pieces it references and the
// pieces it writes. A pure function of a Plan; ExecutePlan (execute.h) carries
// it out.
//
// A generation need not store its config's shards. It is a *covering*: any set
// of stored pieces (shard records, of this or older generations, in whatever
// layout they were written) that holds, on every worker, every box the
// config's ranks on that worker read. Readers assemble each requested box from
// the pieces (GenerationReader::Cover), so a change of layout on one worker is
// committed by reference: the new manifest lists the old pieces, and no tensor
// byte is copied. Bytes are written only for parts of a target that no piece
// on its own worker holds (they must come from another worker), and by a
// compaction, which writes the target shards themselves (contiguous, one
// stored shard per shard key per worker) so that later reads and plans meet
// one piece per shard again.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ptc/store/manifest.h"
#include "transform/plan.h"

namespace ptc::transform {

struct Fragmentation {
  uint64_t shards = 0;
  uint64_t pieces = 0;
  uint64_t smallest_piece = 0;
  double pieces_per_shard() const { return shards ? static_cast<double>(pieces) / shards : 0; }
};

enum class CommitMode {
  // Reference every piece on a target's worker that the target reads; write
  // only the parts that come from other workers.
  kCovering,
  // Write every target shard that is not stored as it is (on its worker, or
  // identically on another worker of a shared store).
  kCompact,
  // As kCovering for workers that each keep a store of their own (a cluster,
  // docs/cluster.md): a piece is referenced only by its own worker's targets,
  // so a shard identical to one on another worker is written too (pulled).
  kWorkerLocal,
  // As kCompact for workers that each keep a store of their own (a cluster's
  // compaction): a target counts as stored as it is only on its own worker, so
  // a shard identical to one on another worker is written too (pulled).
  kCompactWorkerLocal,
};

struct Covering {
  // (index into the source manifest's shards, worker): the pieces the new
  // generation references, each listed for the worker whose ranks read it.
  // Sorted, no repeats.
  std::vector<std::pair<size_t, int>> references;
  uint64_t bytes_referenced = 0;  // their bytes, once per (piece, worker)
  // The pieces to write: Plan::targets are the new pieces (a target shard,
  // or under kCovering the parts of one that come from other workers),
  // Plan::copies fill them (target indices refer to writes.targets).
  Plan writes;
  uint64_t bytes_written = 0;
  // Bytes a compaction of the result would write: target shards that are not
  // stored as they are once this is committed.
  uint64_t compact_bytes = 0;
  // How fragmented the source is as a store of the plan's target: the target
  // shards, the pieces they are read from (a shard stored as it is counts
  // one) and the smallest such piece in bytes (0: none).
  Fragmentation fragmentation;
};

// REQUIRES: plan was made from `source` and has no missing regions.
Covering MakeCovering(const Plan& plan, const GenerationManifest& source, CommitMode mode);

// `covering` with only the writes of targets on `worker`: one worker's part of
// a cluster's change (each worker writes its own pieces; the references, which
// are metadata, stay whole). bytes_written counts the part.
Covering PartOf(const Covering& covering, int worker);

}  // namespace ptc::transform
