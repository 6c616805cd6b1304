// Controller::Reconfigure, Apply and the rewrite they start: a new layout
// served at once over the current generation's shards, written in the
// background (alone, or as this worker's part of a change the job agreed).
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <set>
#include <string>

#include "fs/controller.h"
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

struct Request {
  ptc::ParallelConfig config;
  std::optional<uint64_t> step, epoch;
};

// What was written: the config text itself, or
// {"config": "...", "step": S, "epoch": E} (step and epoch optional).
ptc::Result<Request> ParseRequest(const std::string& raw) {
  std::string text = raw;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.pop_back();
  Request r;
  if (!text.empty() && text.front() == '{') {
    const auto bad = ptc::InvalidArgumentError(
        ".ptcfs/config: expected a config such as tp=4,pp=1 or {\"config\": \"tp=4,pp=1\", \"step\": 100}");
    std::string duplicate;
    nlohmann::json j = ptc::ParseJsonUniqueKeys(text, &duplicate);
    if (!duplicate.empty())
      return ptc::InvalidArgumentError(".ptcfs/config: the field '" + ptc::Abbreviate(duplicate) + "' is given twice");
    if (j.is_discarded() || !j.is_object() || !j.contains("config") || !j["config"].is_string()) return bad;
    for (const auto& [key, value] : j.items()) {
      if (key == "config") continue;
      if (key != "step" && key != "epoch") {
        return ptc::InvalidArgumentError(".ptcfs/config: unknown field '" + ptc::Abbreviate(key) +
                                         "' (config, step, epoch)");
      }
      if (const std::string problem = ptc::UnsignedProblem(value); !problem.empty()) {
        return ptc::InvalidArgumentError(".ptcfs/config: '" + key + "' " + problem);
      }
      (key == "step" ? r.step : r.epoch) = value.get<uint64_t>();
    }
    if (r.epoch && !r.step) return ptc::InvalidArgumentError(".ptcfs/config: 'epoch' needs a 'step'");
    text = j["config"].get<std::string>();
  }
  PTC_ASSIGN_OR_RETURN(r.config, ptc::ParseConfig(text), ".ptcfs/config");
  return r;
}

}  // namespace

// What a cluster change reads: the current generation's pieces (those of the
// participants), and where a region of the new config is on no participant,
// the last resort's pieces too (the manifest widened with them).
struct ChangeSource {
  std::shared_ptr<const ptc::GenerationManifest> manifest;
  std::optional<std::set<int>> alive;
  std::set<int> last_resort;
  std::string unavailable;  // why the last resort could not serve, when it was asked
};

namespace {

ChangeSource SourceOf(AgreedChange& change, const ptc::ModelSpec& spec, const ptc::ParallelConfig& config,
                      std::shared_ptr<const ptc::GenerationManifest> current) {
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

}  // namespace
ptc::Status Controller::Reconfigure(const std::string& text, const std::shared_ptr<const Snapshot>& current) {
  JobParticipant* job = nullptr;
  {
    ptc::MutexLock lock(&mu_);
    job = job_;
  }
  if (job == nullptr) return Start(text, current, nullptr);
  auto request = ParseRequest(text);
  ptc::Status s = request.ok() ? ptc::ValidateConfig(current->spec(), request->config)
                               : ptc::InvalidArgumentError(request.status().message());
  std::optional<MountState> before;
  if (s.ok()) {
    // "proposed" before the job has it: its agent may apply it at once.
    ptc::MutexLock lock(&mu_);
    if (Writing()) {
      s = ptc::FailedPreconditionError(
          "a reconfiguration or save is still running; wait for .ptcfs/status to say serving");
    } else {
      before = state_;
      state_ = MountState::kProposed;
    }
  }
  if (s.ok()) s = job->Propose(text, request->config);
  ptc::MutexLock lock(&mu_);
  if (!s.ok()) {
    if (before && state_ == MountState::kProposed) state_ = *before;
    SetLastError(s.message());
    return s;
  }
  if (state_ == MountState::kProposed) last_error_.clear();  // a failure before is not this request's
  return s;
}

ptc::Status Controller::Apply(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                              std::shared_ptr<AgreedChange> change) {
  ptc::Status s = Start(text, current, change);
  if (s.ok()) return s;
  change->Failed(s);
  ptc::MutexLock lock(&mu_);
  if (!Writing()) {
    state_ = MountState::kFailed;
    SetLastError(s.message());  // "failed" always says why
  }
  return s;
}

void Controller::EndProposal(const ptc::Status& why, bool by_agent) {
  ptc::MutexLock lock(&mu_);
  if (state_ != MountState::kProposed && !(by_agent && state_ == MountState::kServing)) return;
  state_ = MountState::kFailed;
  SetLastError(why.message());
}

ptc::Status Controller::Start(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                              std::shared_ptr<AgreedChange> change) {
  auto fail = [&](const ptc::Status& s) {
    RecordError(s.message());
    return s;
  };
  // A mount alone serves a worker of its config; in a cluster a worker may
  // hold no ranks of a config (it still serves its pieces to the others).
  auto request_worker = [&](const ptc::ParallelConfig& config) {
    if (change || worker_ < 0 || config.HoldsRanks(worker_)) return ptc::Status::OK();
    return ptc::InvalidArgumentError("worker " + std::to_string(worker_) + " holds no ranks in config " +
                                     config.ToString() + " (its workers: " + ptc::WorkersText(config) + ")");
  };
  auto request = ParseRequest(text);
  if (!request.ok()) return fail(ptc::InvalidArgumentError(request.status().message()));
  auto checked = ptc::ModelLayout::Make(current->spec(), request->config);
  if (!checked.ok()) return fail(checked.status());
  const ptc::ModelLayout& layout = *checked;
  const ptc::ParallelConfig& config = layout.config();
  const ptc::ModelSpec& spec = layout.spec();
  if (ptc::Status s = request_worker(config); !s.ok()) return fail(s);
  std::optional<ptc::DatasetState> dataset = current->dataset();
  if (request->step) {
    if (!dataset) return fail(ptc::InvalidArgumentError(".ptcfs/config: 'step' given but the store holds no dataset"));
    auto moved = ptc::StateAtStep(*dataset, *request->step, request->epoch);
    if (!moved.ok()) return fail(moved.status());
    dataset = *moved;
  }
  // The new layout, served at once from the shards of the current generation
  // (in a cluster, also from the last resort's where no participant holds a region).
  std::optional<ChangeSource> src;
  if (change) src = SourceOf(*change, spec, config, store_->CurrentSnapshot());
  auto lazy = Snapshot::Create(*store_, src ? src->manifest : store_->CurrentSnapshot(), layout, worker_, checks_,
                               dataset, source_);
  if (!lazy.ok()) return fail(ptc::InvalidArgumentError(lazy.status().message()));
  PTC_RETURN_IF_ERROR(
      BeginWriting(MountState::kRepartitioning,
                   "a reconfiguration or save is still running; wait for .ptcfs/status to say serving")
          .status());
  serve_(*lazy);
  ptc::MutexLock lock(&mu_);
  worker_thread_ =
      std::thread([this, layout, dataset, change = std::move(change), src = std::move(src), current]() mutable {
        Rewrite(layout, dataset, std::move(change), std::move(src), std::move(current));
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

void Controller::Rewrite(const ptc::ModelLayout& layout, std::optional<ptc::DatasetState> dataset,
                         std::shared_ptr<AgreedChange> change, std::optional<ChangeSource> src,
                         std::shared_ptr<const Snapshot> previous) {
  const ptc::ModelSpec& spec = layout.spec();
  const ptc::ParallelConfig& config = layout.config();
  // Reads of the new layout are served meanwhile (from the old shards) and come
  // first: the rewrite and the executor threads it starts (which inherit this)
  // run at a lower CPU priority. Best effort: the rewrite runs either way.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kRewriteNice);
  ptc::transform::ExecuteOptions options;
  options.threads = threads_;
  if (dataset) options.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  options.progress = [this](uint64_t n) { done_ += n; };
  auto rewrite = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    if (!src) src = ChangeSource{store_->CurrentSnapshot(), std::nullopt, {}, {}};
    const auto& source = src->manifest;
    if (change) {
      options.mode = ptc::transform::CommitMode::kWorkerLocal;
      options.before_commit = [&](ptc::GenerationWriter& w) { return change->BeforeCommit(w, config.ToString()); };
    }
    PTC_ASSIGN_OR_RETURN(ptc::transform::Plan plan,
                         ptc::transform::MakePlan({source.get(), spec, config, {}, src->alive, src->last_resort}));
    if (!plan.missing.empty()) {
      return ptc::FailedPreconditionError(MissingTensors(plan) + (src->unavailable.empty() ? "" : "; " + src->unavailable));
    }
    ptc::transform::Covering covering = ptc::transform::MakeCovering(plan, *source, options.mode);
    if (change) covering = ptc::transform::PartOf(covering, worker_);
    total_ = covering.bytes_written;
    PTC_RETURN_IF_ERROR(ptc::transform::ExecuteCovering(*store_, source, spec, config, covering, options).status());
    return Snapshot::Create(*store_, store_->CurrentSnapshot(), layout, worker_, checks_, dataset, source_);
  };
  // This thread is no FUSE callback: an unexpected exception here would end
  // the daemon, so it fails the rewrite instead (nothing was committed).
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("rewrite not run");
  try {
    result = rewrite();
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the rewrite: ") + e.what());
  }
  if (result.ok()) serve_(*result);
  if (!result.ok() && change) {
    serve_(previous);  // nothing was committed anywhere: the job stays on the old generation
    change->Failed(result.status());
  }
  {
    ptc::MutexLock lock(&mu_);
    state_ = result.ok() ? MountState::kServing : MountState::kFailed;
    if (result.ok()) {
      last_error_.clear();  // committed
    } else {
      SetLastError(result.status().message());
    }
  }
  // After the state says serving: the next Reconfigure or Ingest joins this
  // thread before it writes, so the removal never meets another writer.
  if (!result.ok()) return;
  Collect();
  // A cluster's generations are agreed in etcd: a worker compacting on its own
  // would leave the job's committed state (the job compacts as a change of
  // its own, ApplyCompaction).
  if (!change) MaybeCompact(layout, dataset);
}

}  // namespace ptcfs
