// The executor: runs a Plan against a store on one machine (all workers'
// directories in one store), committing the target config as a new generation
// made as covering.h says:
//
// - CommitMode::kCovering (transform, reconfigure): the new generation
//   references the pieces on each target's worker that hold its bytes, and
//   shards identical to a source on another worker (a shared store can read
//   those files); only parts that must come from another worker are written.
//   On one worker no tensor byte is written, whatever the change.
// - CommitMode::kCompact: every target shard not stored as it is is written.
// - What is written is written in bounded chunks, in parallel over
//   groups of shards (stream.h): where the shards of a group store their boxes
//   in row order (every layout of the built-in schemas), one sweep over rows reads
//   each source shard whole and in order, checks its checksum from those same
//   bytes (no second read) and appends the target rows assembled from them,
//   hashing the new shard on the way. Otherwise each target is assembled from
//   the plan's copies, read at their offsets, after a separate verification
//   of each source shard on first use.
// - Commit uses the store's atomic protocol: on any failure the previous
//   generation stays current and the partial one is removed.
//
// Peak memory: threads * chunk_bytes (or one row of every shard of a group when
// that is more) plus the plan; independent of model size.
#pragma once

#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"
#include "transform/covering.h"
#include "transform/plan.h"

namespace ptc::transform {

struct ExecuteOptions {
  int threads = 2;
  uint64_t chunk_bytes = 1ull << 20;  // 8 MiB buffers fall out of cache: measured 1.6x slower
  ProgressFn progress;                // bytes written
  CommitMode mode = CommitMode::kCovering;
  // Asked after every chunk written: true stops the work with FailedPrecondition
  // ("cancelled"), nothing committed (a mount's background compaction gives way
  // to a reconfigure).
  std::function<bool()> cancelled;
  // Called once everything is written, right before the commit (which it can
  // stop by returning an error: nothing is committed). A cluster worker
  // publishes its part there, waits for the others and adds their pieces
  // (docs/cluster.md).
  std::function<Status(GenerationWriter&)> before_commit;
  // false: every target through the general path (tests compare the two).
  bool sweep = true;
  // Rank files the written shards go into (GenerationWriter::SetRankFiles);
  // empty: HDF5 shard files only.
  std::vector<RankFileSpec> rank_files;
  // Entries set in the new manifest's `extra` over the source's (e.g. "dataset":
  // a new data position committed with the new layout).
  nlohmann::json extra = nlohmann::json::object();
};

// Reports `n` bytes written to options.progress, then asks options.cancelled.
// \error FailedPrecondition "cancelled" when it says so.
Status Advance(const ExecuteOptions& options, uint64_t n);

struct ExecuteResult {
  uint64_t generation = 0;
  uint64_t shards_written = 0;
  uint64_t shards_referenced = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_referenced = 0;  // as Covering::bytes_referenced
};

// Commits MakeCovering(plan, *source, options.mode) with ExecuteCovering.
// REQUIRES: plan made from `source`, which is the store's current generation.
// \error FailedPrecondition naming the tensors when plan.missing is not empty.
// \error as GenerationReader (Corruption for a bad source shard), GenerationWriter and Commit.
Result<ExecuteResult> ExecutePlan(Store& store, std::shared_ptr<const GenerationManifest> source, const ModelSpec& spec,
                                  const ParallelConfig& target, const Plan& plan, const ExecuteOptions& options);

// Writes and commits `covering` (MakeCovering of a plan from `source`, the
// store's current generation) as the next generation, in config `target`.
// \error as GenerationReader, GenerationWriter and Commit.
Result<ExecuteResult> ExecuteCovering(Store& store, std::shared_ptr<const GenerationManifest> source,
                                      const ModelSpec& spec, const ParallelConfig& target, const Covering& covering,
                                      const ExecuteOptions& options);

// Plans and executes a change of the store's current generation to `target`
// (options.mode: a covering by default).
// \error as MakePlan and ExecutePlan.
Result<ExecuteResult> Transform(Store& store, const ParallelConfig& target, const ExecuteOptions& options,
                                const Topology& topology = {});

// A compaction of the store's current generation: its own config as
// CommitMode::kCompact, so that every shard of the config is stored
// contiguously, once per worker (with `box_targets`, every box of one:
// PlanRequest::box_targets).
struct Compaction {
  std::shared_ptr<const GenerationManifest> source;
  ModelSpec spec;
  ParallelConfig config;
  bool box_targets = false;
  Covering covering;  // nothing to write: the generation is compact
};
// `mode`: kCompact, or kCompactWorkerLocal for a cluster's worker (whose
// store holds its own pieces only).
// \error FailedPrecondition when the store has no generation; as MakePlan.
Result<Compaction> PlanCompaction(const Store& store, CommitMode mode = CommitMode::kCompact, bool box_targets = false);

// PlanCompaction, then ExecuteCovering when there is anything to write. When
// nothing needs writing nothing is committed and the result's generation is
// the current one. options.mode is ignored.
// \error as PlanCompaction and ExecuteCovering.
Result<ExecuteResult> Compact(Store& store, const ExecuteOptions& options);

}  // namespace ptc::transform
