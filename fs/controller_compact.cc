// Controller::MaybeCompact: the background compaction after a commit, at
// the lowest CPU priority, giving way to any writer.
#include <sys/resource.h>
#include <unistd.h>

#include "fs/controller.h"
#include "fs/rank_files.h"
#include "transform/execute.h"

namespace ptcfs {
namespace {

// The nice value of a background compaction (0 is the daemon's serving
// threads; a rewrite runs at 10).
constexpr int kCompactNice = 19;

}  // namespace

void Controller::MaybeCompact(const ptc::ModelLayout& layout, const std::optional<ptc::DatasetState>& dataset) {
  auto planned = ptc::transform::PlanCompaction(*store_);
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
  ptc::transform::ExecuteOptions options;
  if (compaction_.rank_files) {  // every shard rewritten into the layout's rank files
    auto with_files = PlanRankFileCompaction(*std::move(planned), layout, compaction_.rank_file_options);
    if (!with_files.ok()) {
      RecordError("planning the rank files: " + with_files.status().message());
      return;
    }
    planned = std::move(with_files->compaction);
    options.rank_files = std::move(with_files->files);
  }
  const ptc::transform::Covering& covering = planned->covering;
  {
    ptc::MutexLock lock(&mu_);
    compaction_state_ = "running";
  }
  compact_done_ = 0;
  compact_total_ = covering.bytes_written;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kCompactNice);
  options.threads = 1;
  options.progress = [this](uint64_t n) { compact_done_ += n; };
  options.cancelled = [this] { return cancel_compaction_.load(); };
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(
        ptc::transform::ExecuteCovering(*store_, planned->source, planned->spec, planned->config, covering, options)
            .status());
    return Snapshot::Create(*store_, store_->CurrentSnapshot(), layout, worker_, checks_, dataset, source_);
  };
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("compaction not run");
  try {
    result = compact();
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
  std::optional<ptc::transform::Fragmentation> after;
  if (result.ok()) {
    serve_(*result);
    if (auto measured = ptc::transform::PlanCompaction(*store_); measured.ok())
      after = measured->covering.fragmentation;
  }
  {
    ptc::MutexLock lock(&mu_);
    if (result.ok()) {
      compaction_state_ = "done";
      if (after) fragmentation_ = *after;
    } else if (cancel_compaction_) {
      compaction_state_ = "cancelled";
    } else {
      compaction_state_ = "failed";
      SetLastError("background compaction: " + result.status().message());
    }
  }
  Collect();
}

}  // namespace ptcfs
