#include "fs/controller.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/megatron.h"
#include "ptc/checkpoint/megatron_import.h"
#include "ptc/store/model_spec.h"
#include "transform/execute.h"

namespace ptcfs {
namespace {

// The tensors of which no live worker holds a part, named (the first ones).
std::string MissingTensors(const ptc::Plan& plan) {
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

// The nice values of a background rewrite and of a background compaction (0
// is the daemon's serving threads).
constexpr int kRewriteNice = 10;
constexpr int kCompactNice = 19;

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

// The data position a save commits with its model. Megatron counts
// args.consumed_train_samples over the whole run, the global batch B per step
// and never reset at an epoch (docs/dataset_format.md, "A save's position"):
// T = consumed / B steps, so epoch T / S and step T % S of the store's epochs
// of S = ceil(N / B) steps (the end of an epoch is step 0 of the next).
// `current` when the store has no dataset or the save's args do not say.
// Also checks that the save's 'iteration' is the one the latest file names.
ptc::Result<std::optional<ptc::DatasetState>> SavedDataPosition(const ptc::CheckpointSource& source, uint64_t iteration,
                                                                const std::optional<ptc::DatasetState>& current) {
  const std::string what = "the saved state dict";
  PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState saved, ptc::megatron::LoadMegatronState(source.extra, what));
  if (const ptc::pickle::Value* it = saved.carried.Find("iteration");
      it != nullptr && it->kind() == ptc::pickle::Kind::kInt && it->as_int() != static_cast<int64_t>(iteration)) {
    return ptc::InvalidArgumentError(what + " says iteration " + std::to_string(it->as_int()) + ", " +
                                     std::string(ptc::megatron::kLatestFile) + " names " + std::to_string(iteration));
  }
  if (!current) return current;
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> consumed,
                       ptc::megatron::ArgsInt(saved.carried, "consumed_train_samples", what));
  if (!consumed) return current;
  const std::string name = "args.consumed_train_samples " + std::to_string(*consumed);
  const uint64_t batch = current->global_batch;
  if (*consumed < 0 || static_cast<uint64_t>(*consumed) % batch != 0) {
    return ptc::InvalidArgumentError(name + " is not a position of the dataset: a multiple of its global batch " +
                                     std::to_string(batch) + " (the samples of every step since the start) is");
  }
  const uint64_t steps = static_cast<uint64_t>(*consumed) / batch, per_epoch = current->steps_per_epoch();
  auto moved = ptc::StateAtStep(*current, steps % per_epoch, steps / per_epoch);
  if (!moved.ok()) return ptc::InvalidArgumentError(name + ": " + moved.status().message());
  return std::optional<ptc::DatasetState>(*moved);
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
  auto plan = ptc::MakePlan({src.manifest.get(), spec, config, {}, src.alive});
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

const char* MountStateName(MountState state) {
  switch (state) {
    case MountState::kServing:
      return "serving";
    case MountState::kProposed:
      return "proposed";
    case MountState::kRepartitioning:
      return "repartitioning";
    case MountState::kSaving:
      return "saving";
    case MountState::kRejoining:
      return "rejoining";
    case MountState::kFailed:
      return "failed";
  }
  return "unknown";
}

Controller::Controller(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
                       std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
                       std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect)
    : store_(store),
      worker_(worker),
      threads_(threads),
      compaction_(compaction),
      checks_(std::move(checks)),
      source_(std::move(source)),
      serve_(std::move(serve)),
      collect_(std::move(collect)) {}

Controller::~Controller() {
  std::thread t;
  {
    ptc::MutexLock lock(&mu_);
    t = std::move(worker_thread_);
  }
  JoinBackground(std::move(t));
}

void Controller::JoinBackground(std::thread previous) {
  cancel_compaction_ = true;
  if (previous.joinable()) previous.join();
  cancel_compaction_ = false;
}

bool Controller::Busy() const {
  ptc::MutexLock lock(&mu_);
  return Writing();
}

void Controller::RecordError(const std::string& error) {
  ptc::MutexLock lock(&mu_);
  SetLastError(error);
}

void Controller::SetLastError(const std::string& error) {
  if (error.size() <= kMaxLastError) {
    last_error_ = error;
    return;
  }
  last_error_ = error.substr(0, kMaxLastError) + "... (" + std::to_string(error.size() - kMaxLastError) + " bytes cut)";
}

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
  if (!Writing()) state_ = MountState::kFailed;
  return s;
}

void Controller::EndProposal(const ptc::Status& why) {
  ptc::MutexLock lock(&mu_);
  if (state_ != MountState::kProposed) return;
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
  const ptc::ParallelConfig& config = request->config;
  const ptc::ModelSpec& spec = current->spec();
  if (ptc::Status s = ptc::ValidateConfig(spec, config); !s.ok()) return fail(s);
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
  auto lazy = Snapshot::Create(*store_, src ? src->manifest : store_->CurrentSnapshot(), spec, config, worker_, checks_,
                               dataset, source_);
  if (!lazy.ok()) return fail(ptc::InvalidArgumentError(lazy.status().message()));
  std::thread previous;
  {
    ptc::MutexLock lock(&mu_);
    if (Writing()) {
      return ptc::FailedPreconditionError(
          "a reconfiguration or save is still running; wait for .ptcfs/status to say serving");
    }
    state_ = MountState::kRepartitioning;
    last_error_.clear();
    done_ = 0;
    total_ = 0;
    previous = std::move(worker_thread_);
  }
  JoinBackground(std::move(previous));  // its state was set (it may still be removing old files or compacting)
  { ptc::MutexLock wait(&collect_mu_); }     // a removal after a close (CollectIfIdle) ends before the rewrite writes
  serve_(*lazy);
  ptc::MutexLock lock(&mu_);
  worker_thread_ = std::thread(
      [this, config, spec, dataset, change = std::move(change), src = std::move(src), current]() mutable {
        Rewrite(config, spec, dataset, std::move(change), std::move(src), std::move(current));
        // The replaced layout's views, trees and plan are freed by now (but for
        // nodes the kernel still holds): give the pages back, or a daemon keeps
        // the peak of its largest layout for good (issue 24 item 3).
#if defined(__GLIBC__)
        ::malloc_trim(0);
#endif
      });
  return ptc::Status::OK();
}

void Controller::Rewrite(ptc::ParallelConfig config, ptc::ModelSpec spec, std::optional<ptc::DatasetState> dataset,
                         std::shared_ptr<AgreedChange> change, std::optional<ChangeSource> src,
                         std::shared_ptr<const Snapshot> previous) {
  // Reads of the new layout are served meanwhile (from the old shards) and come
  // first: the rewrite and the executor threads it starts (which inherit this)
  // run at a lower CPU priority. Best effort: the rewrite runs either way.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kRewriteNice);
  ptc::ExecuteOptions options;
  options.threads = threads_;
  if (dataset) options.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
  options.progress = [this](uint64_t n) { done_ += n; };
  auto rewrite = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    if (!src) src = ChangeSource{store_->CurrentSnapshot(), std::nullopt, {}, {}};
    const auto& source = src->manifest;
    if (change) {
      options.mode = ptc::CommitMode::kWorkerLocal;
      options.before_commit = [&](ptc::GenerationWriter& w) { return change->BeforeCommit(w, config.ToString()); };
    }
    PTC_ASSIGN_OR_RETURN(ptc::Plan plan, ptc::MakePlan({source.get(), spec, config, {}, src->alive, src->last_resort}));
    if (!plan.missing.empty()) {
      return ptc::FailedPreconditionError(MissingTensors(plan) + (src->unavailable.empty() ? "" : "; " + src->unavailable));
    }
    ptc::Covering covering = ptc::MakeCovering(plan, *source, options.mode);
    if (change) covering = ptc::PartOf(covering, worker_);
    total_ = covering.bytes_written;
    PTC_RETURN_IF_ERROR(ptc::ExecuteCovering(*store_, source, spec, config, covering, options).status());
    return Snapshot::Create(*store_, store_->CurrentSnapshot(), spec, config, worker_, checks_, dataset, source_);
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
  // would leave the job's committed state.
  if (!change) MaybeCompact(spec, dataset);
}

void Controller::MaybeCompact(const ptc::ModelSpec& spec, const std::optional<ptc::DatasetState>& dataset) {
  auto planned = ptc::PlanCompaction(*store_);
  if (!planned.ok()) {
    RecordError("measuring the generation's pieces: " + planned.status().message());
    return;
  }
  const ptc::Covering& covering = planned->covering;
  {
    ptc::MutexLock lock(&mu_);
    fragmentation_ = covering.fragmentation;
    if (covering.writes.targets.empty() || !compaction_.Due(covering.fragmentation) || state_ != MountState::kServing ||
        cancel_compaction_) {
      return;
    }
    compaction_state_ = "running";
  }
  compact_done_ = 0;
  compact_total_ = covering.bytes_written;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kCompactNice);
  ptc::ExecuteOptions options;
  options.threads = 1;
  options.progress = [this](uint64_t n) { compact_done_ += n; };
  options.cancelled = [this] { return cancel_compaction_.load(); };
  auto compact = [&]() -> ptc::Result<std::shared_ptr<const Snapshot>> {
    PTC_RETURN_IF_ERROR(ptc::ExecuteCovering(*store_, planned->source, planned->spec, planned->config, covering,
                                             options)
                            .status());
    return Snapshot::Create(*store_, store_->CurrentSnapshot(), spec, planned->config, worker_, checks_, dataset,
                            source_);
  };
  ptc::Result<std::shared_ptr<const Snapshot>> result = ptc::InternalError("compaction not run");
  try {
    result = compact();
  } catch (const std::exception& e) {
    result = ptc::InternalError(std::string("internal error in the compaction: ") + e.what());
  }
  std::optional<ptc::Fragmentation> after;
  if (result.ok()) {
    serve_(*result);
    if (auto measured = ptc::PlanCompaction(*store_); measured.ok()) after = measured->covering.fragmentation;
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

void Controller::Collect() { Collect(/*only_when_idle=*/false); }

void Controller::CollectIfIdle() { Collect(/*only_when_idle=*/true); }

void Controller::Collect(bool only_when_idle) {
  ptc::Status s;
  {
    ptc::MutexLock lock(&collect_mu_);
    if (only_when_idle) {
      ptc::MutexLock state(&mu_);
      // A running rewrite, save or compaction collects after its commit.
      if (Writing() || compaction_state_ == "running") return;
    }
    s = collect_();
  }
  if (!s.ok()) RecordError("removing replaced generations: " + s.message());
}

ptc::Status Controller::Ingest(const std::string& staging_root, uint64_t iteration,
                               const std::shared_ptr<const Snapshot>& current) {
  bool in_cluster = false;
  {
    ptc::MutexLock lock(&mu_);
    in_cluster = job_ != nullptr;
  }
  if (in_cluster) {
    const ptc::Status s = ptc::FailedPreconditionError(
        "megatron/: saves through a mount that is one worker of a cluster are not supported yet "
        "(a save would commit a generation the other workers do not have)");
    RecordError(s.message());
    return s;
  }
  MountState before = MountState::kServing;
  std::thread previous;
  {
    ptc::MutexLock lock(&mu_);
    if (Writing()) {
      return ptc::FailedPreconditionError(
          "a reconfiguration or save is running; save again once .ptcfs/status "
          "says serving");
    }
    before = state_;
    state_ = MountState::kSaving;
    previous = std::move(worker_thread_);
  }
  JoinBackground(std::move(previous));    // a finished rewrite, perhaps still removing what it replaced or compacting
  { ptc::MutexLock wait(&collect_mu_); }  // a removal after a close (CollectIfIdle) ends before the save writes
  auto result = [&]() -> ptc::Status {
    const ptc::ModelSpec& spec = current->spec();
    ptc::ParallelConfig config = current->config();
    if (config.zero == 1) {
      return ptc::InvalidArgumentError(
          "saves through megatron/ need zero=0: Megatron's model_optim_rng.pt does not "
          "hold ZeRO-1 optimizer state");
    }
    ptc::MegatronImportOptions o{staging_root, spec.schema, spec.dims, iteration, std::nullopt};
    PTC_ASSIGN_OR_RETURN(ptc::CheckpointSource source, ptc::OpenMegatronCheckpoint(store_->env(), o));
    // One generation, one state: the model, the optimizer and the data position together.
    PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset,
                         SavedDataPosition(source, iteration, current->dataset()));
    if (dataset) source.extra["dataset"] = ptc::EncodeDatasetState(*dataset);
    if (source.config.tp != config.tp || source.config.pp != config.pp) {
      if (source.config.pp != config.pp) config.pp_layers.clear();
      config.tp = source.config.tp;
      config.pp = source.config.pp;
    }
    source.config = config;
    PTC_RETURN_IF_ERROR(ptc::ImportInto(store_, source).status());
    PTC_ASSIGN_OR_RETURN(auto snap, Snapshot::Create(*store_, store_->CurrentSnapshot(), source.spec, config, worker_,
                                                     checks_, dataset, source_));
    serve_(snap);
    {
      ptc::MutexLock lock(&mu_);
      last_error_.clear();  // committed
    }
    Collect();
    return ptc::Status::OK();
  }();
  ptc::MutexLock lock(&mu_);
  state_ = result.ok() ? MountState::kServing : before;
  if (!result.ok()) SetLastError("save of iteration " + std::to_string(iteration) + ": " + result.message());
  return result;
}

std::string Controller::StatusJson(const std::shared_ptr<const Snapshot>& current) const {
  ptc::MutexLock lock(&mu_);
  nlohmann::json j = {
      {"generation", current->generation()},
      {"config", current->config().ToString()},
      {"state", MountStateName(state_)},
      {"bytes_done", done_.load()},
      {"bytes_total", total_.load()},
      {"last_error", last_error_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_error_)},
      {"dataset", nullptr},
      {"compaction",
       {{"state", compaction_state_},
        {"bytes_done", compact_done_.load()},
        {"bytes_total", compact_total_.load()},
        {"shards", fragmentation_.shards},
        {"pieces", fragmentation_.pieces},
        {"smallest_piece", fragmentation_.smallest_piece}}},
  };
  if (const auto& d = current->dataset()) {
    j["dataset"] = {{"epoch", d->epoch},
                    {"step", d->step()},
                    {"consumed", d->consumed},
                    {"samples", d->num_samples},
                    {"global_batch", d->global_batch}};
  }
  if (job_ != nullptr) j["cluster"] = job_->StatusPart();
  // Messages quote what was written and paths: bytes that are not UTF-8 become U+FFFD.
  return ptc::JsonText(j, 2) + "\n";
}

}  // namespace ptcfs
