// Controller::MaybeCompact: the background compaction after a commit, at
// the lowest CPU priority, giving way to any writer; and the same as a
// cluster worker's part of a compaction the job runs as a change
// (ApplyCompaction, docs/cluster.md "Compaction").
#include <sys/resource.h>
#include <unistd.h>

#include "fs/controller.h"
#include "transform/execute.h"
#include "view/rank_files.h"

namespace ptcfs {
namespace {

// The nice value of a background compaction (0 is the daemon's serving
// threads; a rewrite runs at 10).
constexpr int kCompactNice = 19;

}  // namespace

void Controller::MaybeCompact(const ptc::ModelLayout& layout, const std::optional<ptc::DatasetState>& dataset) {
  auto planned =
      ptc::transform::PlanCompaction(*store_, ptc::transform::CommitMode::kCompact, compaction_.box_targets());
  if (!planned.ok()) {
    RecordError("measuring the generation's pieces: " + planned.status().message());
    return;
  }
  if (planned->config.ToString() != layout.config().ToString()) {
    RecordError("compaction: the store holds config " + planned->config.ToString() + ", the mount serves " +
                layout.config().ToString());
    return;
  }
  {
    ptc::MutexLock lock(&mu_);
    fragmentation_ = planned->covering.fragmentation;
    if (planned->covering.writes.targets.empty() || !compaction_.Due(planned->covering.fragmentation) ||
        state_ != MountState::kServing || cancel_compaction_) {
      return;
    }
  }
  std::vector<ptc::RankFileSpec> files;
  if (compaction_.rank_files) {  // every shard rewritten into the layout's rank files
    auto with_files = PrepareRankFileCompaction(*store_, *std::move(planned), layout, compaction_.rank_file_options);
    if (!with_files.ok()) {
      RecordError("planning the rank files: " + with_files.status().message());
      return;
    }
    planned = std::move(with_files->compaction);
    files = std::move(with_files->files);
  }
  EndCompaction(RunCompaction(*planned, std::move(files), layout, dataset, nullptr), "background compaction",
                ptc::transform::CommitMode::kCompact, /*aborted=*/false);
}

bool Controller::CompactionDue(const std::shared_ptr<const Snapshot>& current) {
  auto planned = ptc::transform::PlanCompaction(*store_, ptc::transform::CommitMode::kCompactWorkerLocal,
                                                compaction_.box_targets());
  if (!planned.ok()) {
    RecordError("measuring the generation's pieces: " + planned.status().message());
    return false;
  }
  if (planned->source->generation != current->generation()) return false;  // a change committed meanwhile
  ptc::MutexLock lock(&mu_);
  fragmentation_ = planned->covering.fragmentation;
  return !planned->covering.writes.targets.empty() && compaction_.Due(planned->covering.fragmentation);
}

ptc::Status Controller::ApplyCompaction(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                                        std::shared_ptr<AgreedChange> change) {
  {
    ptc::MutexLock lock(&mu_);
    if (!Writing() && compacting_ == nullptr) {
      compacting_ = change;
      compaction_state_ = "running";
      compaction_why_.clear();
      compact_done_ = 0;
      compact_total_ = 0;
      cancel_compaction_ = false;  // no writer joins the background thread now (none holds the role)
      // The thread joins the one before (a finished change, perhaps still
      // removing what it replaced); a writer that starts meanwhile joins it.
      worker_thread_ = std::thread([this, rank_files, current, change, previous = std::move(worker_thread_)]() mutable {
        if (previous.joinable()) previous.join();
        CompactInCluster(rank_files, current, change);
      });
      return ptc::Status::OK();
    }
  }
  const ptc::Status busy =
      ptc::FailedPreconditionError("compaction: a change or save still runs on worker " + std::to_string(worker_));
  change->Failed(busy);
  return busy;
}

void Controller::CompactInCluster(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                                  const std::shared_ptr<AgreedChange>& change) {
  const ptc::ModelLayout& layout = current->layout();
  bool publishing = false;  // this worker's part is written: an error now is mostly the job's abort
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    // Every worker plans the same compaction of the same generation; each writes its own targets.
    PTC_ASSIGN_OR_RETURN(ptc::transform::Compaction planned,
                         ptc::transform::PlanCompaction(*store_, ptc::transform::CommitMode::kCompactWorkerLocal,
                                                        rank_files && BoxTargets(compaction_.rank_file_options)));
    if (planned.source->generation != current->generation() ||
        planned.config.ToString() != layout.config().ToString()) {
      return ptc::FailedPreconditionError(
          "compaction: the store holds generation " + std::to_string(planned.source->generation) + " (" +
          planned.config.ToString() + "), the job compacts " + std::to_string(current->generation()) + " (" +
          layout.config().ToString() + ")");
    }
    std::vector<ptc::RankFileSpec> files;
    if (rank_files) {
      PTC_ASSIGN_OR_RETURN(
          RankFileCompaction with_files,
          PrepareRankFileCompaction(*store_, std::move(planned), layout, compaction_.rank_file_options, worker_),
          "planning the rank files");
      planned = std::move(with_files.compaction);
      files = std::move(with_files.files);
    }
    planned.covering = ptc::transform::PartOf(planned.covering, worker_);
    const std::string config = layout.config().ToString();
    return RunCompaction(planned, std::move(files), layout, current->dataset(), [&](ptc::GenerationWriter& w) {
      publishing = true;
      return change->BeforeCommit(w, config);
    });
  };
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("compaction not run");
  try {
    result = compact();
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
  if (!result.ok()) change->Failed(result.status());  // nothing commits anywhere
  // The job aborted it (another worker failed or gave way, a worker left):
  // cancelled here, the reason kept; this worker's own failure: failed.
  const bool aborted = publishing && result.status().code() == ptc::Code::kFailedPrecondition;
  EndCompaction(result, "compaction of the job", ptc::transform::CommitMode::kCompactWorkerLocal, aborted);
  ptc::MutexLock lock(&mu_);
  compacting_.reset();
}

ptc::Result<std::shared_ptr<const Snapshot>> Controller::RunCompaction(
    const ptc::transform::Compaction& planned, std::vector<ptc::RankFileSpec> files, const ptc::ModelLayout& layout,
    const std::optional<ptc::DatasetState>& dataset, std::function<ptc::Status(ptc::GenerationWriter&)> before_commit) {
  const ptc::transform::Covering& covering = planned.covering;
  {
    ptc::MutexLock lock(&mu_);
    compaction_state_ = "running";
    compaction_why_.clear();
  }
  compact_done_ = 0;
  compact_total_ = covering.bytes_written;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kCompactNice);
  ptc::transform::ExecuteOptions options;
  options.rank_files = std::move(files);
  options.threads = 1;
  options.progress = [this](uint64_t n) { compact_done_ += n; };
  options.cancelled = [this] { return cancel_compaction_.load(); };
  options.before_commit = std::move(before_commit);
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(
        ptc::transform::ExecuteCovering(*store_, planned.source, planned.spec, planned.config, covering, options)
            .status());
    return Snapshot::Create(*store_, store_->CurrentSnapshot(), layout, worker_, checks_, dataset, source_);
  };
  try {
    return compact();
  } catch (const std::exception& e) {
    return ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
}

void Controller::EndCompaction(const ptc::Result<std::shared_ptr<const Snapshot>>& result, const std::string& what,
                               ptc::transform::CommitMode mode, bool aborted) {
  std::optional<ptc::transform::Fragmentation> after;
  if (result.ok()) {
    serve_(*result);
    if (auto measured = ptc::transform::PlanCompaction(*store_, mode, compaction_.box_targets()); measured.ok())
      after = measured->covering.fragmentation;
  }
  {
    ptc::MutexLock lock(&mu_);
    compaction_why_ = result.ok() ? "" : result.status().message();
    if (result.ok()) {
      compaction_state_ = "done";
      if (after) fragmentation_ = *after;
    } else if (aborted || cancel_compaction_ ||
               result.status().message().find(kCompactionGivesWay) != std::string::npos) {
      compaction_state_ = "cancelled";
    } else {
      compaction_state_ = "failed";
      SetLastError(what + ": " + result.status().message());
    }
  }
  Collect();
}

}  // namespace ptcfs
