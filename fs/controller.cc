// The Controller: each request to the write of its kind (fs/writes/), alone
// over a LocalChange or as a change of the job; and the status document.
#include "fs/controller.h"

#include <unistd.h>

#include <optional>

#include "fs/writes/adopt.h"
#include "fs/writes/compaction.h"
#include "fs/writes/dcp_save.h"
#include "fs/writes/local_change.h"
#include "fs/writes/megatron_save.h"
#include "fs/writes/relayout.h"
#include "fs/writes/relayout_request.h"
#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/megatron.h"

namespace ptcfs {
namespace {

constexpr char kSaveBusy[] = "a reconfiguration or save is running; save again once .ptcfs/status says serving";
constexpr char kApplyBusy[] = "a reconfiguration or save is running";

nlohmann::json OrNull(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }

}  // namespace

Controller::Controller(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
                       std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
                       std::function<void(std::shared_ptr<const Snapshot>)> serve, std::function<ptc::Status()> collect)
    : ctx_(store, worker, threads, compaction, std::move(checks), std::move(source), std::move(serve),
           std::move(collect)) {}

Controller::~Controller() = default;

ptc::Status Controller::Reconfigure(const std::string& text, const std::shared_ptr<const Snapshot>& current) {
  JobParticipant* job = ctx_.job();
  if (job == nullptr) return RelayoutWrite(ctx_, text, current).Run(std::make_shared<LocalChange>(ctx_.worker()));
  return Propose(*job, text, current);
}

ptc::Status Controller::Propose(JobParticipant& job, const std::string& text,
                                const std::shared_ptr<const Snapshot>& current) {
  auto request = ParseRelayoutRequest(text);
  ptc::Status s = request.ok() ? ptc::ValidateConfig(current->spec(), request->config)
                               : ptc::InvalidArgumentError(request.status().message());
  std::optional<MountState> before;
  if (s.ok()) {
    // "proposed" before the job has it: its agent may apply it at once.
    ctx_.Update([&](MountStatus& status) {
      if (status.writing()) {
        s = ptc::FailedPreconditionError(
            "a reconfiguration or save is still running; wait for .ptcfs/status to say serving");
      } else {
        before = status.state;
        status.state = MountState::kProposed;
      }
    });
  }
  if (s.ok()) s = job.Propose(text, request->config);
  ctx_.Update([&](MountStatus& status) {
    if (!s.ok()) {
      if (before && status.state == MountState::kProposed) status.state = *before;
      status.SetLastError(s.message());
    } else if (status.state == MountState::kProposed) {
      status.last_error.clear();  // a failure before is not this request's
    }
  });
  return s;
}

ptc::Status Controller::Apply(const std::string& text, const std::shared_ptr<const Snapshot>& current,
                              std::shared_ptr<AgreedChange> change) {
  return RelayoutWrite(ctx_, text, current).Run(std::move(change));
}

void Controller::EndProposal(const ptc::Status& why, bool by_agent) {
  ctx_.Update([&](MountStatus& status) {
    if (status.state != MountState::kProposed && !(by_agent && status.state == MountState::kServing)) return;
    status.state = MountState::kFailed;
    status.SetLastError(why.message());
  });
}

void Controller::Recovered(const std::string& why) {
  ctx_.Update([&](MountStatus& status) { status.Resolve(why); });
}

ptc::Status Controller::Ingest(const std::string& staging_root, uint64_t iteration,
                               const std::shared_ptr<const Snapshot>& current) {
  const std::string what = "save of iteration " + std::to_string(iteration) + ": ";
  return ctx_.RunHere(MountState::kSaving, kSaveBusy, what, [&]() -> ptc::Status {
    JobParticipant* job = ctx_.job();
    const std::string name = ptc::megatron::IterationDirName(iteration);
    const std::string iter_dir = ptc::JoinPath(staging_root, name);
    if (ctx_.store().env()->Exists(ptc::JoinPath(iter_dir, ptc::dcp::kMcoreMetadataFile))) {
      return SaveTorchDist(job, iter_dir, name, iteration, current);
    }
    ptc::Result<std::shared_ptr<AgreedChange>> change =
        job == nullptr ? std::make_shared<LocalChange>(ctx_.worker()) : job->ProposeSave(iteration);
    PTC_RETURN_IF_ERROR(change.status());
    ptc::Status s = MegatronSaveWrite(ctx_, staging_root, iteration, current).Run(**change);
    if (s.ok()) return s;
    (*change)->Failed(s);
    // In a job the save failed (close() says EIO), the mount is not busy.
    return job == nullptr ? s : ptc::IOError(s.message());
  });
}

ptc::Status Controller::SaveTorchDist(JobParticipant* job, const std::string& iter_dir, const std::string& name,
                                      uint64_t iteration, const std::shared_ptr<const Snapshot>& current) {
  auto state = ReadTorchDistState(ctx_.store(), iter_dir, iteration, *current, megatron_names_);
  ptc::Status s = state.ok() ? SaveDcp(job, iter_dir, name, ptc::dcp::Keys::kMegatronCore, &*state, current, {})
                             : state.status();
  return s.ok() || job == nullptr ? s : ptc::IOError(s.message());
}

ptc::Status Controller::IngestDcp(const std::string& dir, const std::string& save,
                                  const std::shared_ptr<const Snapshot>& current,
                                  const std::function<void()>& committed) {
  return ctx_.RunHere(MountState::kSaving, kSaveBusy, "DCP save " + dir + ": ", [&] {
    JobParticipant* job = ctx_.job();
    const ptc::Status s = SaveDcp(job, dir, save, ptc::dcp::Keys::kTorch, nullptr, current, committed);
    // In a job the save failed (the rename says EIO).
    return s.ok() || job == nullptr ? s : ptc::IOError(s.message());
  });
}

ptc::Status Controller::SaveDcp(JobParticipant* job, const std::string& dir, const std::string& save,
                                ptc::dcp::Keys keys, const TorchDistState* state,
                                const std::shared_ptr<const Snapshot>& current,
                                const std::function<void()>& committed) {
  std::shared_ptr<AgreedChange> change = std::make_shared<LocalChange>(ctx_.worker());
  std::string metadata;
  if (job != nullptr) {
    PTC_ASSIGN_OR_RETURN(metadata, ptc::dcp::ReadMetadata(ctx_.store().env(), dir));
    PTC_ASSIGN_OR_RETURN(change, job->ProposeDcpSave(save, metadata));
  }
  const ptc::Status s =
      DcpSaveWrite(ctx_, dir, keys, current, megatron_names_, state).Run(*change, metadata, committed);
  if (!s.ok()) change->Failed(s);
  return s;
}

ptc::Status Controller::ApplyDcpSave(const std::string& dir, std::string metadata, ptc::dcp::Keys keys,
                                     const std::shared_ptr<const Snapshot>& current,
                                     std::shared_ptr<AgreedChange> change, std::function<void(bool committed)> done) {
  auto committed = std::make_shared<bool>(false);
  return ctx_.RunInBackground(
      MountState::kSaving, kApplyBusy, "DCP save " + dir + ": ", std::move(change),
      [this, dir, metadata = std::move(metadata), keys, current, done, committed](AgreedChange& c) {
        return DcpSaveWrite(ctx_, dir, keys, current, megatron_names_).Run(c, metadata, [&] {
          *committed = true;
          done(true);
        });
      },
      [done, committed](bool) {
        if (!*committed) done(false);
      });
}

ptc::Status Controller::ApplySave(const std::string& staging_root, uint64_t iteration,
                                  const std::shared_ptr<const Snapshot>& current, std::shared_ptr<AgreedChange> change,
                                  std::function<void(bool committed)> done) {
  return ctx_.RunInBackground(
      MountState::kSaving, kApplyBusy, "save of iteration " + std::to_string(iteration) + ": ", std::move(change),
      [this, staging_root, iteration, current](AgreedChange& c) {
        return MegatronSaveWrite(ctx_, staging_root, iteration, current).Run(c);
      },
      std::move(done));
}

bool Controller::CompactionDue(const std::shared_ptr<const Snapshot>& current) {
  return CompactionWrite::Due(ctx_, *current);
}

ptc::Status Controller::ApplyCompaction(bool rank_files, const std::shared_ptr<const Snapshot>& current,
                                        std::shared_ptr<AgreedChange> change) {
  WriteContext& ctx = ctx_;
  if (ctx_.StartCompaction(change, [&ctx, rank_files, current, change] {
        CompactionWrite(ctx, rank_files, current).Run(*change);
      })) {
    return ptc::Status::OK();
  }
  const ptc::Status busy =
      ptc::FailedPreconditionError("compaction: a change or save still runs on worker " + std::to_string(ctx_.worker()));
  change->Failed(busy);
  return busy;
}

ptc::Status Controller::Adopt(const std::function<ptc::Status(ptc::Store&)>& write) {
  return AdoptWrite(ctx_).Run(write);
}

std::string Controller::StatusJson(const std::shared_ptr<const Snapshot>& current,
                                   const nlohmann::json& passthrough) const {
  nlohmann::json j;
  ctx_.Read([&](const MountStatus& status, const JobParticipant* job) {
    const WriteProgress& progress = ctx_.progress();
    const WriteProgress& compaction = ctx_.compaction_progress();
    j = {
        {"generation", current->generation()},
        {"config", current->config().ToString()},
        {"pid", static_cast<int64_t>(::getpid())},
        {"state", MountStateName(status.state)},
        {"bytes_done", progress.done.load()},
        {"bytes_total", progress.total.load()},
        {"last_error", OrNull(status.last_error)},
        {"earlier_error", OrNull(status.earlier_error)},
        {"dataset", nullptr},
        {"compaction",
         {{"state", CompactionStateName(status.compaction)},
          {"why", OrNull(status.compaction_why)},
          {"bytes_done", compaction.done.load()},
          {"bytes_total", compaction.total.load()},
          {"shards", status.fragmentation.shards},
          {"pieces", status.fragmentation.pieces},
          {"smallest_piece", status.fragmentation.smallest_piece}}},
    };
    if (job != nullptr) j["cluster"] = job->StatusPart();
  });
  if (const auto& d = current->dataset()) {
    j["dataset"] = {{"epoch", d->epoch},
                    {"step", d->step()},
                    {"consumed", d->consumed},
                    {"samples", d->num_samples},
                    {"global_batch", d->global_batch}};
  }
  if (!passthrough.is_null()) j["passthrough"] = passthrough;
  // Messages quote what was written and paths: bytes that are not UTF-8 become U+FFFD.
  return ptc::JsonText(j, 2) + "\n";
}

}  // namespace ptcfs
