// RelayoutWrite: a new layout served at once over the current generation's
// pieces, written in the background (alone, or as this worker's part of a
// change the job agreed).
#include "fs/writes/relayout.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <set>
#include <string>
#include <thread>

#include "fs/writes/compaction.h"
#include "fs/writes/relayout_request.h"
#include "ptc/base/json_fields.h"
#include "transform/execute.h"

namespace ptcfs {
namespace {

// The tensors of which no live worker holds a part, named (the first ones).
std::string MissingTensors(const ptc::transform::Plan& plan) {
  std::set<std::string> tensors;
  for (const auto& [tensor, box] : plan.missing) tensors.insert(tensor);
  std::string names;
  size_t shown = 0;
  for (const std::string& t : tensors) {
    if (shown++ == 8) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "'" : ", '") + t + "'";
  }
  return "no live worker holds parts of " + std::to_string(tensors.size()) + " tensors (" +
         std::to_string(plan.missing.size()) + " regions), so they cannot be recovered: " + names;
}

// The nice value of a background rewrite (0 is the daemon's serving threads).
constexpr int kRewriteNice = 10;

}  // namespace

// What a change of the job reads: the current generation's pieces (those of
// the participants), and where a region of the new config is on no
// participant, the last resort's pieces too (the manifest widened with them).
struct ChangeSource {
  std::shared_ptr<const ptc::GenerationManifest> manifest;
  std::optional<std::set<int>> alive;
  std::set<int> last_resort;
  std::string unavailable;  // why the last resort could not serve, when it was asked
};

namespace {

// Alone: nullopt (the rewrite reads the store's current generation then).
std::optional<ChangeSource> SourceOf(AgreedChange& change, const ptc::ModelSpec& spec,
                                     const ptc::ParallelConfig& config,
                                     std::shared_ptr<const ptc::GenerationManifest> current) {
  if (change.alone()) return std::nullopt;
  ChangeSource src{std::move(current), change.participants(), {}, {}};
  if (!change.has_last_resort()) return src;
  auto plan = ptc::transform::MakePlan({src.manifest.get(), spec, config, {}, src.alive});
  if (!plan.ok() || plan->missing.empty()) return src;
  auto pieces = change.LastResort();
  if (!pieces.ok()) {
    src.unavailable = pieces.status().message();
    return src;
  }
  auto widened = std::make_shared<ptc::GenerationManifest>(*src.manifest);
  for (ptc::ShardRecord& s : *pieces) {
    src.last_resort.insert(s.worker);
    src.alive->insert(s.worker);
    widened->shards.push_back(std::move(s));
  }
  src.manifest = std::move(widened);
  return src;
}

// The layout and data position a request asks for over `current`. A mount
// alone serves a worker of its config; in a cluster a worker may hold no
// ranks of a config (it still serves its pieces to the others).
struct Checked {
  ptc::ModelLayout layout;
  std::optional<ptc::DatasetState> dataset;
};
ptc::Result<Checked> Check(const std::string& text, const Snapshot& current, int worker, bool alone) {
  auto request = ParseRelayoutRequest(text);
  if (!request.ok()) return ptc::InvalidArgumentError(request.status().message());
  PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(current.spec(), request->config));
  const ptc::ParallelConfig& config = layout.config();
  if (alone && worker >= 0 && !config.HoldsRanks(worker)) {
    return ptc::InvalidArgumentError("worker " + std::to_string(worker) + " holds no ranks in config " +
                                     config.ToString() + " (its workers: " + ptc::WorkersText(config) + ")");
  }
  std::optional<ptc::DatasetState> dataset = current.dataset();
  if (request->step) {
    if (!dataset) return ptc::InvalidArgumentError(".ptcfs/config: 'step' given but the store holds no dataset");
    PTC_ASSIGN_OR_RETURN(dataset, ptc::StateAtStep(*dataset, *request->step, request->epoch));
  }
  return Checked{std::move(layout), std::move(dataset)};
}

}  // namespace

ptc::Status RelayoutWrite::Run(std::shared_ptr<AgreedChange> change) {
  const ptc::Status s = Start(change);
  if (s.ok() || change->alone()) return s;
  change->Failed(s);
  ctx_.Update([&](MountStatus& status) {
    if (status.writing()) return;
    status.state = MountState::kFailed;
    status.SetLastError(s.message());  // "failed" always says why
  });
  return s;
}

ptc::Status RelayoutWrite::Start(std::shared_ptr<AgreedChange> change) {
  auto checked = Check(request_, *current_, ctx_.worker(), change->alone());
  if (!checked.ok()) {
    ctx_.RecordError(checked.status().message());
    return checked.status();
  }
  const ptc::ModelLayout& layout = checked->layout;
  // The new layout, served at once from the shards of the current generation
  // (in a cluster, also from the last resort's where no participant holds a region).
  std::optional<ChangeSource> src = SourceOf(*change, layout.spec(), layout.config(), ctx_.store().CurrentSnapshot());
  auto lazy = ctx_.MakeSnapshot(src ? src->manifest : ctx_.store().CurrentSnapshot(), layout, checked->dataset);
  if (!lazy.ok()) {
    ctx_.RecordError(lazy.status().message());
    return ptc::InvalidArgumentError(lazy.status().message());
  }
  PTC_RETURN_IF_ERROR(
      ctx_.BeginWriting(MountState::kRepartitioning,
                        "a reconfiguration or save is still running; wait for .ptcfs/status to say serving")
          .status());
  ctx_.Serve(*lazy);
  ctx_.StartBackground([self = *this, layout, dataset = checked->dataset, change = std::move(change),
                        src = std::move(src)]() mutable {
    self.Rewrite(layout, std::move(dataset), std::move(change), std::move(src));
    // The replaced layout's views, trees and plan are freed by now (but for
    // nodes the kernel still holds): give the pages back, or a daemon keeps
    // the peak of its largest layout for good (issue 24 item 3).
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // (Not under a sanitizer: its allocator is not glibc's, and glibc's
    // first malloc_trim from two threads at once corrupts its arena count.)
    ::malloc_trim(0);
#endif
  });
  return ptc::Status::OK();
}

ptc::Result<std::shared_ptr<const Snapshot>> RelayoutWrite::Write(const ptc::ModelLayout& layout,
                                                                  const std::optional<ptc::DatasetState>& dataset,
                                                                  AgreedChange& change,
                                                                  std::optional<ChangeSource>& src) {
  const ptc::ModelSpec& spec = layout.spec();
  const ptc::ParallelConfig& config = layout.config();
  ptc::transform::ExecuteOptions options;
  options.threads = ctx_.threads();
  if (dataset) options.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  WriteProgress& progress = ctx_.progress();
  options.progress = [&progress](uint64_t n) { progress.done += n; };
  if (!src) src = ChangeSource{ctx_.store().CurrentSnapshot(), std::nullopt, {}, {}};
  const auto& source = src->manifest;
  if (!change.alone()) {
    options.mode = ptc::transform::CommitMode::kWorkerLocal;
    options.before_commit = [&](ptc::GenerationWriter& w) { return change.BeforeCommit(w, config.ToString()); };
  }
  PTC_ASSIGN_OR_RETURN(ptc::transform::Plan plan,
                       ptc::transform::MakePlan({source.get(), spec, config, {}, src->alive, src->last_resort}));
  if (!plan.missing.empty()) {
    return ptc::FailedPreconditionError(MissingTensors(plan) + (src->unavailable.empty() ? "" : "; " + src->unavailable));
  }
  ptc::transform::Covering covering = ptc::transform::MakeCovering(plan, *source, options.mode);
  if (!change.alone()) covering = ptc::transform::PartOf(covering, ctx_.worker());
  progress.total = covering.bytes_written;
  PTC_RETURN_IF_ERROR(ptc::transform::ExecuteCovering(ctx_.store(), source, spec, config, covering, options).status());
  return ctx_.MakeSnapshot(layout, dataset);
}

void RelayoutWrite::Rewrite(const ptc::ModelLayout& layout, std::optional<ptc::DatasetState> dataset,
                            std::shared_ptr<AgreedChange> change, std::optional<ChangeSource> src) {
  // Reads of the new layout are served meanwhile (from the old shards) and come
  // first: the rewrite and the executor threads it starts (which inherit this)
  // run at a lower CPU priority. Best effort: the rewrite runs either way.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kRewriteNice);
  // This thread is no FUSE callback: an unexpected exception here would end
  // the daemon, so it fails the rewrite instead (nothing was committed).
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("rewrite not run");
  try {
    result = Write(layout, dataset, *change, src);
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the rewrite: ") + e.what());
  }
  if (result.ok()) ctx_.Serve(*result);
  if (!result.ok()) {
    // In a job nothing was committed anywhere: the job stays on the old
    // generation. Alone the new layout stays served (lazily).
    if (!change->alone()) ctx_.Serve(current_);
    change->Failed(result.status());
  }
  ctx_.Update([&](MountStatus& status) {
    status.state = result.ok() ? MountState::kServing : MountState::kFailed;
    if (result.ok()) {
      status.last_error.clear();  // committed
    } else {
      status.SetLastError(result.status().message());
    }
  });
  // After the state says serving: the next writer joins this thread before
  // it writes, so the removal never meets another writer.
  if (!result.ok()) return;
  ctx_.Collect();
  // A cluster's generations are agreed in etcd: a worker compacting on its own
  // would leave the job's committed state (the job compacts as a change of
  // its own, CompactionWrite over its change).
  if (change->alone()) CompactionWrite(ctx_, ctx_.compaction_policy().rank_files, *result).Run(*change);
}

}  // namespace ptcfs
