// CompactionWrite: the background compaction of a mount alone, and a
// worker's part of a compaction the job runs as a change.
#include "fs/writes/compaction.h"

#include <sys/resource.h>
#include <unistd.h>

#include "transform/execute.h"

namespace ptcfs {
namespace {

// The nice value of a background compaction (0 is the daemon's serving
// threads; a rewrite runs at 10).
constexpr int kCompactNice = 19;

}  // namespace

bool CompactionWrite::Due(WriteContext& ctx, const Snapshot& current) {
  const CompactionPolicy& policy = ctx.compaction_policy();
  auto planned = ptc::transform::PlanCompaction(ctx.store(), ptc::transform::CommitMode::kCompactWorkerLocal,
                                                policy.box_targets());
  if (!planned.ok()) {
    ctx.RecordError("measuring the generation's pieces: " + planned.status().message());
    return false;
  }
  if (planned->source->generation != current.generation()) return false;  // a change committed meanwhile
  bool due = false;
  ctx.Update([&](MountStatus& status) {
    status.fragmentation = planned->covering.fragmentation;
    due = !planned->covering.writes.targets.empty() && policy.Due(planned->covering.fragmentation);
  });
  return due;
}

void CompactionWrite::Run(AgreedChange& change) {
  if (change.alone()) {
    std::optional<Planned> planned = PlanAlone();
    if (!planned) return;
    End(Write(std::move(*planned), nullptr), "background compaction", ptc::transform::CommitMode::kCompact,
        /*aborted=*/false);
    return;
  }
  bool publishing = false;  // this worker's part is written: an error now is mostly the job's abort
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_ASSIGN_OR_RETURN(Planned planned, PlanPart());
    const std::string config = current_->config().ToString();
    return Write(std::move(planned), [&](ptc::GenerationWriter& w) {
      publishing = true;
      return change.BeforeCommit(w, config);
    });
  };
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("compaction not run");
  try {
    result = compact();
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
  if (!result.ok()) change.Failed(result.status());  // nothing commits anywhere
  // The job aborted it (another worker failed or gave way, a worker left):
  // cancelled here, the reason kept; this worker's own failure: failed.
  const bool aborted = publishing && result.status().code() == ptc::Code::kFailedPrecondition;
  End(result, "compaction of the job", ptc::transform::CommitMode::kCompactWorkerLocal, aborted);
}

std::optional<CompactionWrite::Planned> CompactionWrite::PlanAlone() {
  const CompactionPolicy& policy = ctx_.compaction_policy();
  const ptc::ModelLayout& layout = current_->layout();
  auto planned = ptc::transform::PlanCompaction(ctx_.store(), ptc::transform::CommitMode::kCompact,
                                                policy.box_targets());
  if (!planned.ok()) {
    ctx_.RecordError("measuring the generation's pieces: " + planned.status().message());
    return std::nullopt;
  }
  if (planned->config.ToString() != layout.config().ToString()) {
    ctx_.RecordError("compaction: the store holds config " + planned->config.ToString() + ", the mount serves " +
                     layout.config().ToString());
    return std::nullopt;
  }
  bool run = false;
  ctx_.Update([&](MountStatus& status) {
    status.fragmentation = planned->covering.fragmentation;
    run = !planned->covering.writes.targets.empty() && policy.Due(planned->covering.fragmentation) &&
          status.state == MountState::kServing && !ctx_.compaction_cancelled();
  });
  if (!run) return std::nullopt;
  if (!rank_files_) return Planned{*std::move(planned), {}};
  // Every shard rewritten into the layout's rank files.
  auto with_files = PrepareRankFileCompaction(ctx_.store(), *std::move(planned), layout, policy.rank_file_options);
  if (!with_files.ok()) {
    ctx_.RecordError("planning the rank files: " + with_files.status().message());
    return std::nullopt;
  }
  return Planned{std::move(with_files->compaction), std::move(with_files->files)};
}

ptc::Result<CompactionWrite::Planned> CompactionWrite::PlanPart() {
  const RankFileOptions& options = ctx_.compaction_policy().rank_file_options;
  const ptc::ModelLayout& layout = current_->layout();
  // Every worker plans the same compaction of the same generation; each writes its own targets.
  PTC_ASSIGN_OR_RETURN(ptc::transform::Compaction planned,
                       ptc::transform::PlanCompaction(ctx_.store(), ptc::transform::CommitMode::kCompactWorkerLocal,
                                                      rank_files_ && BoxTargets(options)));
  if (planned.source->generation != current_->generation() || planned.config.ToString() != layout.config().ToString()) {
    return ptc::FailedPreconditionError(
        "compaction: the store holds generation " + std::to_string(planned.source->generation) + " (" +
        planned.config.ToString() + "), the job compacts " + std::to_string(current_->generation()) + " (" +
        layout.config().ToString() + ")");
  }
  Planned part;
  if (rank_files_) {
    PTC_ASSIGN_OR_RETURN(RankFileCompaction with_files,
                         PrepareRankFileCompaction(ctx_.store(), std::move(planned), layout, options, ctx_.worker()),
                         "planning the rank files");
    planned = std::move(with_files.compaction);
    part.files = std::move(with_files.files);
  }
  planned.covering = ptc::transform::PartOf(planned.covering, ctx_.worker());
  part.compaction = std::move(planned);
  return part;
}

ptc::Result<std::shared_ptr<const Snapshot>> CompactionWrite::Write(
    Planned planned, std::function<ptc::Status(ptc::GenerationWriter&)> before_commit) {
  const ptc::transform::Compaction& compaction = planned.compaction;
  const ptc::transform::Covering& covering = compaction.covering;
  ctx_.Update([](MountStatus& status) {
    status.compaction = CompactionState::kRunning;
    status.compaction_why.clear();
  });
  WriteProgress& progress = ctx_.compaction_progress();
  progress.done = 0;
  progress.total = covering.bytes_written;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kCompactNice);
  ptc::transform::ExecuteOptions options;
  options.rank_files = std::move(planned.files);
  options.threads = 1;
  options.progress = [&progress](uint64_t n) { progress.done += n; };
  options.cancelled = [this] { return ctx_.compaction_cancelled(); };
  options.before_commit = std::move(before_commit);
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(ptc::transform::ExecuteCovering(ctx_.store(), compaction.source, compaction.spec,
                                                        compaction.config, covering, options)
                            .status());
    return ctx_.MakeSnapshot(current_->layout(), current_->dataset());
  };
  try {
    return compact();
  } catch (const std::exception& e) {
    return ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
}

void CompactionWrite::End(const ptc::Result<std::shared_ptr<const Snapshot>>& result, const std::string& what,
                          ptc::transform::CommitMode mode, bool aborted) {
  std::optional<ptc::transform::Fragmentation> after;
  if (result.ok()) {
    ctx_.Serve(*result);
    if (auto measured = ptc::transform::PlanCompaction(ctx_.store(), mode, ctx_.compaction_policy().box_targets());
        measured.ok())
      after = measured->covering.fragmentation;
  }
  ctx_.Update([&](MountStatus& status) {
    status.compaction_why = result.ok() ? "" : result.status().message();
    if (result.ok()) {
      status.compaction = CompactionState::kDone;
      if (after) status.fragmentation = *after;
    } else if (aborted || ctx_.compaction_cancelled() ||
               result.status().message().find(kCompactionGivesWay) != std::string::npos) {
      status.compaction = CompactionState::kCancelled;
    } else {
      status.compaction = CompactionState::kFailed;
      status.SetLastError(what + ": " + result.status().message());
    }
  });
  ctx_.Collect();
}

}  // namespace ptcfs
