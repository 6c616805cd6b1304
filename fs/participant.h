// What a mount that is one worker of a cluster job asks of the job, and what
// it is told (docs/cluster.md). The Controller talks to these interfaces;
// worker/agent.cc implements them over the cluster layer, which fs/ does not
// see.
//
// Thread safety: as each method says.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/model/config.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/manifest.h"

namespace ptcfs {

class AgreedChange;

// Begins the reason a compaction of the job (a change of its own,
// Controller::ApplyCompaction) is aborted with when a reconfiguration, a save
// or an unmount goes first: its workers then say "cancelled", not "failed".
inline constexpr std::string_view kCompactionGivesWay = "the compaction gives way to ";

// The job this mount is a worker of.
class JobParticipant {
 public:
  virtual ~JobParticipant() = default;
  // A valid request written to .ptcfs/config (`config` parsed from it): goes
  // to the job, which every worker then applies (Controller::Apply). From a
  // FUSE thread.
  // \error FailedPrecondition when this worker is not a member now or a
  //        change is under way; InvalidArgument when the config needs a worker
  //        that is not live.
  virtual ptc::Status Propose(const std::string& request, const ptc::ParallelConfig& config) = 0;
  // A Megatron save whose latest file was written on this mount: goes to the
  // job as a change of every live worker, each of which adds the rank files
  // written on it (Controller::ApplySave). Returns this worker's own part of
  // it (the agent does not apply it here). From a FUSE thread, with the
  // controller's writer role held.
  // \error FailedPrecondition when this worker is not a member now or a
  //        change is under way.
  virtual ptc::Result<std::shared_ptr<AgreedChange>> ProposeSave(uint64_t iteration) = 0;
  // A DCP save whose .metadata (`metadata`) landed on this mount, in the
  // staging area's directory `save` (kDcpStaging/NAME): as ProposeSave, each
  // worker adding the chunk files written on it (Controller::ApplyDcpSave).
  // \error as ProposeSave; InvalidArgument for a .metadata too large for the job to carry.
  virtual ptc::Result<std::shared_ptr<AgreedChange>> ProposeDcpSave(const std::string& save,
                                                                    const std::string& metadata) = 0;
  // The "cluster" part of .ptcfs/status; asked with the controller's lock
  // held (it must not call the controller).
  virtual nlohmann::json StatusPart() const = 0;
};

// The one door through which every change the job agreed enters this mount:
// Filesystem implements it, worker/agent.cc applies each change through it,
// one method per kind of change (cluster/change_request.h). Each does what the
// Controller method it names says (in the background; `change` publishes this
// worker's part and awaits the job's commit; on an error change->Failed is
// called too). Called from the agent's thread.
class ChangeApplier {
 public:
  virtual ~ChangeApplier() = default;
  // A change of layout (`request`: the text written to .ptcfs/config on the
  // proposer), over the generation served now (Controller::Apply).
  virtual ptc::Status ApplyRelayout(const std::string& request, std::shared_ptr<AgreedChange> change) = 0;
  // A Megatron save of `iteration`: this mount's part is the rank files staged here (Controller::ApplySave).
  virtual ptc::Status ApplySave(uint64_t iteration, std::shared_ptr<AgreedChange> change) = 0;
  // A DCP save (`metadata`) in staging directory `save`: this mount's part is
  // the chunk files written here (Controller::ApplyDcpSave).
  virtual ptc::Status ApplyDcpSave(const std::string& save, std::string metadata,
                                   std::shared_ptr<AgreedChange> change) = 0;
  // A compaction of the generation served now, into rank files or not (Controller::ApplyCompaction).
  virtual ptc::Status ApplyCompaction(bool rank_files, std::shared_ptr<AgreedChange> change) = 0;
};

// One change of layout the job agreed, as this worker applies it: it reads
// only the participants' pieces, writes only its own part (the pieces its new
// ranks lack) and commits only after BeforeCommit, which returns the other
// workers' pieces. Called from the controller's rewrite thread.
class AgreedChange {
 public:
  virtual ~AgreedChange() = default;
  // Whether this worker's part is the whole change: a mount alone
  // (fs/writes/local_change.h), which reads and writes the whole store,
  // publishes nothing and has no job to tell of a failure.
  virtual bool alone() const { return false; }
  virtual const std::set<int>& participants() const = 0;
  // With this worker's part written (`config`: the new config, canonical):
  // adds the others' pieces to the writer, or fails (nothing is committed,
  // the previous layout is served again).
  virtual ptc::Status BeforeCommit(ptc::GenerationWriter& writer, const std::string& config) = 0;
  // A save's commit (ApplySave): with this worker's part written (its
  // pieces in `writer`, `tensors` their records, `extra` what its rank files
  // hold besides), publishes it; once every participant's part is in,
  // `settle` gives the new config from all of them (by worker, this one's
  // included; the same on every worker), or an error that aborts the save
  // everywhere. Adds the others' pieces to the writer and returns every part.
  using SettleFn = std::function<ptc::Result<std::string>(const std::map<int, ptc::Part>& parts)>;
  virtual ptc::Result<std::map<int, ptc::Part>> BeforeSaveCommit(ptc::GenerationWriter& writer,
                                                                 const std::vector<ptc::TensorRecord>& tensors,
                                                                 const nlohmann::json& extra,
                                                                 const SettleFn& settle) = 0;
  // The change failed on this worker (before or in BeforeCommit).
  virtual void Failed(const ptc::Status& error) = 0;
  // Whether LastResort may give pieces (the job has a durable tier).
  virtual bool has_last_resort() const = 0;
  // Pieces to read only where no participant holds the bytes (the job's
  // durable tier), asked when the plan lacks some: their records, each on a
  // worker that is no participant.
  // \error why there are none; it is added to the message naming what cannot be recovered.
  virtual ptc::Result<std::vector<ptc::ShardRecord>> LastResort() = 0;
};

}  // namespace ptcfs
