// One worker's side of the job's reconfiguration protocol over etcd
// (docs/cluster.md, "Reconfigure across workers"). Keys: job_state.h.
//
// 1. Propose: a change of the committed generation G to the live members,
//    put only if nothing else is under way and G is still committed (one
//    transaction). It clears what an aborted attempt at G + 1 left.
// 2. Every participant applies the change's request to its mount, writes its
//    part (the pieces its new ranks lack, pulled from the peers) durably, and
//    calls Finish: it publishes the part (only while the change stands), then
//    waits. The first worker that sees every participant's part commits in
//    one transaction: committed = G + 1 with the digest of all pieces, the
//    change removed. Every worker then commits the same generation locally.
// 3. A participant that fails (Fail), leaves the job (its lease expired) or a
//    timeout aborts the change in one transaction: nothing is committed
//    anywhere and every worker keeps generation G.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cluster/job_state.h"
#include "cluster/kv_store.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"

namespace ptc::cluster {

struct FinishDecision;  // commit_rule.h

struct CoordinatorOptions {
  std::string job;
  int worker = 0;
  // The longest Finish waits between two looks at etcd: a watch wakes it as
  // soon as anything of the job changes.
  std::chrono::milliseconds poll{1000};
  std::chrono::milliseconds timeout{600000};  // a change not committed by then is aborted
  size_t max_value_bytes = kMaxEtcdValue;     // a larger part is cut (CutPart)
};

class Coordinator {
 public:
  // `etcd` must outlive the coordinator.
  Coordinator(const KvStore* etcd, CoordinatorOptions options);

  const CoordinatorOptions& options() const { return options_; }

  // Agrees this worker's store with the job at start-up: when etcd holds no
  // committed state yet, `current` (the store's current generation) becomes
  // it; otherwise the two must be the same generation with the same pieces.
  // `contents` (Committed::contents) defaults to the generation's digest: a
  // job's first generation wrote its bytes. A generation restored from the
  // durable tier (durable_restore.h) names the copy's contents instead, and
  // `replace`, when given, is the committed value (as etcd holds it) of the
  // job whose every worker was lost: it is replaced only while it is still
  // the value, its change (if any) deleted with it.
  // \error FailedPrecondition naming both generations (or digests) when they differ.
  Status Join(const GenerationManifest& current, const std::string& contents = "",
              const std::optional<std::string>& replace = std::nullopt) const;

  Result<std::optional<Committed>> GetCommitted() const;
  // The change under way, if any.
  Result<std::optional<Change>> Pending() const;

  // Proposes `request` (a config validated by the caller) as a change of
  // committed generation `from` to `workers` (the live members), among which
  // must be every worker the config places ranks on (`needed`).
  // \error FailedPrecondition when a change is under way or `from` is no
  //        longer committed; InvalidArgument when a worker the config needs is
  //        not among `workers`.
  Result<Change> Propose(const std::string& request, uint64_t from, std::vector<int> workers,
                         const std::vector<int>& needed) const;

  // This worker's part of `change` is durable: `mine` (its pieces and what
  // else the others need of it) and `referenced` (the generation's other
  // pieces, the same on every worker). Publishes the part, waits for the
  // others' and the commit (see above) and returns every participant's part,
  // by worker. Once every part is in, `settle` gives the new generation's
  // config from them on each worker (the same everywhere); its error, before
  // the commit, aborts the change naming it. `new_contents`: the change
  // writes new tensor bytes (a save), so that the committed generation is
  // its own contents (Committed::contents); else it keeps the bytes its
  // generation `from` held. Etcd out of reach (IOError: this
  // worker's link cut) is tried again each `poll` until the timeout: the job
  // may commit the part meanwhile, so it is kept until the outcome is known.
  // \error Aborted as FailedPrecondition naming the reason (a worker failed,
  //        left, the timeout, `settle`), after which nothing is committed
  //        anywhere; Corruption when the committed digest differs from this worker's.
  using SettleFn = std::function<Result<std::string>(const std::map<int, Part>& parts)>;
  Result<std::map<int, Part>> Finish(const Change& change, const SettleFn& settle, const Part& mine,
                                     const std::vector<ShardRecord>& referenced,
                                     const std::vector<TensorRecord>& tensors, bool new_contents) const;
  // The same for a change whose config is known before (a change of layout):
  // returns the other participants' pieces.
  Result<std::vector<ShardRecord>> Finish(const Change& change, const std::string& config,
                                          const std::vector<ShardRecord>& written,
                                          const std::vector<ShardRecord>& referenced,
                                          const std::vector<TensorRecord>& tensors) const;

  // This worker could not apply `change`, which cannot commit without its
  // part: aborts it (one transaction, while it stands), naming `error`. Best
  // effort: the others also abort it when this worker's lease expires or
  // the change times out.
  void Fail(const Change& change, const Status& error) const;

  // Aborts `change` while it stands (one transaction), naming `reason`: Fail,
  // or a change none of whose participants is live any more (no one is left
  // to abort it otherwise, and it would refuse every later proposal).
  void Withdraw(const Change& change, const std::string& reason) const;

  // Why `change` ended without a commit: FailedPrecondition naming it and
  // the reason its aborted record gives ("withdrawn" when there is none).
  Status Aborted(const Change& change) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Round;  // what one look of Finish read (coordinator.cc)

  // Finish, in steps: this worker's part published while the change stands
  // (Publish), then looks until the outcome is known, each one reading the
  // job's keys and settling the parts (Read, Settle), deciding with the
  // commit rule (DecideFinish, commit_rule.h) and doing what it decided
  // (Act: commit, abort, return the parts, or wait for a change of the job's
  // keys). A look returns every part once committed, nullopt to look again.
  Result<std::optional<std::map<int, Part>>> Look(const Change& change, const SettleFn& settle,
                                                  const std::vector<ShardRecord>& referenced, bool new_contents,
                                                  Clock::time_point deadline) const;
  Status Publish(const Change& change, const Part& mine, const std::vector<TensorRecord>& tensors,
                 Clock::time_point deadline) const;
  Result<Round> Read(const Change& change, const SettleFn& settle, const std::vector<ShardRecord>& referenced,
                     Clock::time_point deadline) const;
  void Settle(const Change& change, const SettleFn& settle, const std::vector<ShardRecord>& referenced,
              Round& round) const;
  Result<std::optional<std::map<int, Part>>> Act(const Change& change, const FinishDecision& decision, Round& round,
                                                 bool new_contents, Clock::time_point deadline) const;
  // Whether `s` is etcd out of reach before `deadline`: then sleeps a `poll`
  // and the caller tries again.
  bool Unreachable(const Status& s, Clock::time_point deadline) const;

  // Aborts `change` (as etcd holds it at `revision`) for `reason`; returns
  // the error Finish reports.
  Status Abort(const Change& change, int64_t revision, const std::string& reason) const;

  const KvStore* const etcd_;
  const CoordinatorOptions options_;
};

}  // namespace ptc::cluster
