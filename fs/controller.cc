// The Controller's state, its status document and the store's writer role
// that a rewrite (controller_reconfigure.cc), a save (controller_save.cc),
// an adopted generation (controller_adopt.cc) and a background compaction
// (controller_compact.cc) take in turn.
#include "fs/controller.h"

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"

namespace ptcfs {


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

ptc::Result<MountState> Controller::BeginWriting(MountState state, const std::string& busy) {
  MountState before;
  std::thread previous;
  {
    ptc::MutexLock lock(&mu_);
    if (Writing()) return ptc::FailedPreconditionError(busy);
    before = state_;
    state_ = state;
    if (state == MountState::kRepartitioning) {
      last_error_.clear();
      done_ = 0;
      total_ = 0;
    }
    previous = std::move(worker_thread_);
  }
  JoinBackground(std::move(previous));    // a finished rewrite, perhaps still removing what it replaced or compacting
  { ptc::MutexLock wait(&collect_mu_); }  // a removal after a close (CollectIfIdle) ends before the writer writes
  return before;
}

void Controller::JoinBackground(std::thread previous) {
  cancel_compaction_ = true;
  std::shared_ptr<AgreedChange> compacting;
  {
    ptc::MutexLock lock(&mu_);
    compacting = compacting_;
  }
  // A compaction of the job may wait for the others' parts: its change is
  // aborted everywhere (when it still stands), which ends that wait.
  if (compacting) {
    compacting->Failed(ptc::FailedPreconditionError(std::string(kCompactionGivesWay) + "a change on worker " +
                                                    std::to_string(worker_)));
  }
  if (previous.joinable()) previous.join();
  cancel_compaction_ = false;
}

void Controller::CancelCompaction() {
  ptc::MutexLock lock(&mu_);
  if (compacting_) cancel_compaction_ = true;
}

bool Controller::Busy() const {
  ptc::MutexLock lock(&mu_);
  return Writing() || compacting_ != nullptr;
}

void Controller::Recovered(const std::string& why) {
  ptc::MutexLock lock(&mu_);
  if (state_ != MountState::kFailed) return;
  state_ = MountState::kServing;
  earlier_error_ = last_error_ + " (resolved: " + why + ")";
  if (earlier_error_.size() > kMaxLastError) earlier_error_ = earlier_error_.substr(0, kMaxLastError) + "...";
  last_error_.clear();
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

std::string Controller::StatusJson(const std::shared_ptr<const Snapshot>& current,
                                   const nlohmann::json& passthrough) const {
  ptc::MutexLock lock(&mu_);
  nlohmann::json j = {
      {"generation", current->generation()},
      {"config", current->config().ToString()},
      {"pid", static_cast<int64_t>(::getpid())},
      {"state", MountStateName(state_)},
      {"bytes_done", done_.load()},
      {"bytes_total", total_.load()},
      {"last_error", last_error_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_error_)},
      {"earlier_error", earlier_error_.empty() ? nlohmann::json(nullptr) : nlohmann::json(earlier_error_)},
      {"dataset", nullptr},
      {"compaction",
       {{"state", compaction_state_},
        {"why", compaction_why_.empty() ? nlohmann::json(nullptr) : nlohmann::json(compaction_why_)},
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
  if (!passthrough.is_null()) j["passthrough"] = passthrough;
  if (job_ != nullptr) j["cluster"] = job_->StatusPart();
  // Messages quote what was written and paths: bytes that are not UTF-8 become U+FFFD.
  return ptc::JsonText(j, 2) + "\n";
}

}  // namespace ptcfs
