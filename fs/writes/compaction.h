// A compaction of the served generation (docs/mount_format.md, "Compaction";
// docs/cluster.md, "Compaction"): its pieces rewritten contiguously (with
// rank files, into its ranks' rank files) in the same config, at the lowest
// CPU priority with one thread, serving meanwhile, giving way to any writer
// (cancelled at its next chunk, nothing committed). Alone (LocalChange) it
// runs after a rewrite's commit when the policy says so; in a job every
// worker writes its own part of the change the job agreed and the job
// commits all parts or none.
//
// Thread safety: Run on the context's background thread; Due from any.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fs/participant.h"
#include "fs/writes/write_context.h"
#include "transform/covering.h"
#include "view/rank_files.h"
#include "view/snapshot.h"

namespace ptcfs {

class CompactionWrite {
 public:
  // `rank_files`: into the layout's rank files (alone the policy's, in a job
  // as the change says); `current`: the served generation it compacts.
  CompactionWrite(WriteContext& ctx, bool rank_files, std::shared_ptr<const Snapshot> current)
      : ctx_(ctx), rank_files_(rank_files), current_(std::move(current)) {}

  // Alone: measures the generation (the status shows it) and compacts it
  // when the policy wants it and nothing else runs; a failure to plan is kept
  // as last_error. In a job: this worker's part (PartOf) of the same plan on
  // every worker, committed with change.BeforeCommit; on an error
  // change.Failed (nothing commits anywhere). Then the new generation is
  // served and measured ("done"), or the compaction is "cancelled" (a writer
  // took the role, the job aborted it) or "failed" (last_error says why);
  // what it replaced is removed.
  void Run(AgreedChange& change);

  // A job's compaction (Controller::CompactionDue): measures `current` (the
  // status shows it) and says whether the policy wants it compacted. False
  // on a failure (kept as last_error) or when a change committed meanwhile.
  static bool Due(WriteContext& ctx, const Snapshot& current);

 private:
  struct Planned {
    ptc::transform::Compaction compaction;
    std::vector<ptc::RankFileSpec> files;  // with rank files: those it writes
  };
  // Alone: nullopt when nothing is to run (not due, a writer waits, or an
  // error, kept as last_error).
  std::optional<Planned> PlanAlone();
  // In a job: this worker's part. \error FailedPrecondition when the store
  // moved on from `current`; as PlanCompaction, PrepareRankFileCompaction.
  ptc::Result<Planned> PlanPart();
  // Writes `planned` and commits it (`before_commit`: a job's) as the
  // running compaction; returns the committed generation's snapshot.
  ptc::Result<std::shared_ptr<const Snapshot>> Write(Planned planned,
                                                     std::function<ptc::Status(ptc::GenerationWriter&)> before_commit);
  // Serves and measures the result, or says cancelled (also when `aborted`)
  // or failed (`what` names it in last_error); removes what it replaced.
  void End(const ptc::Result<std::shared_ptr<const Snapshot>>& result, const std::string& what,
           ptc::transform::CommitMode mode, bool aborted);

  WriteContext& ctx_;
  const bool rank_files_;
  const std::shared_ptr<const Snapshot> current_;
};

}  // namespace ptcfs
