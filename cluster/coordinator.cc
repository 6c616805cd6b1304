#include "cluster/coordinator.h"

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "cluster/commit_rule.h"
#include "cluster/membership.h"
#include "ptc/base/checksum.h"

namespace ptc::cluster {
namespace {

// How often Finish looks at etcd when it cannot watch it.
constexpr std::chrono::milliseconds kPollWithoutWatch{25};

std::string NewChangeId(int worker) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return "w" + std::to_string(worker) + "-" + ChecksumToString(r);
}

}  // namespace

Coordinator::Coordinator(const KvStore* etcd, CoordinatorOptions options) : etcd_(etcd), options_(std::move(options)) {}

Result<std::optional<Committed>> Coordinator::GetCommitted() const {
  PTC_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, etcd_->Get(CommittedKey(options_.job)));
  if (!kv) return std::optional<Committed>();
  PTC_ASSIGN_OR_RETURN(Committed c, DecodeCommitted("etcd key " + kv->key, kv->value));
  return std::optional<Committed>(std::move(c));
}

Result<std::optional<Change>> Coordinator::Pending() const {
  PTC_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, etcd_->Get(ChangeKey(options_.job)));
  if (!kv) return std::optional<Change>();
  PTC_ASSIGN_OR_RETURN(Change c, DecodeChange("etcd key " + kv->key, kv->value));
  return std::optional<Change>(std::move(c));
}

Status Coordinator::Join(const GenerationManifest& current, const std::string& contents,
                         const std::optional<std::string>& replace) const {
  const std::string digest = PiecesDigest(current.config, current.shards);
  const Committed mine{current.generation, current.config, digest, contents.empty() ? digest : contents};
  TxnRequest txn;
  txn.compare = {replace ? Compare::ValueIs(CommittedKey(options_.job), *replace)
                         : Compare::Absent(CommittedKey(options_.job))};
  txn.success = {TxnOp::Put(CommittedKey(options_.job), EncodeCommitted(mine))};
  if (replace) txn.success.push_back(TxnOp::Delete(ChangeKey(options_.job)));
  PTC_ASSIGN_OR_RETURN(TxnResponse r, etcd_->Txn(txn));
  if (r.succeeded) return Status::OK();
  PTC_ASSIGN_OR_RETURN(std::optional<Committed> job, GetCommitted());
  if (!job) return FailedPreconditionError("job " + options_.job + ": its committed state vanished while joining");
  const std::string who = "worker " + std::to_string(options_.worker) + " of job " + options_.job;
  if (job->generation != mine.generation) {
    return FailedPreconditionError(who + ": the store is at generation " + std::to_string(mine.generation) +
                                   ", the job committed generation " + std::to_string(job->generation) +
                                   " (it changed meanwhile: mount again)");
  }
  if (job->digest != mine.digest || job->config != mine.config) {
    return FailedPreconditionError(who + ": generation " + std::to_string(mine.generation) + " of the store (" +
                                   mine.config + ", pieces " + mine.digest + ") is not the job's (" + job->config +
                                   ", pieces " + job->digest + ")");
  }
  return Status::OK();
}

Result<Change> Coordinator::Propose(const std::string& request, uint64_t from, std::vector<int> workers,
                                    const std::vector<int>& needed) const {
  std::sort(workers.begin(), workers.end());
  workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
  for (int w : needed) {
    if (!std::binary_search(workers.begin(), workers.end(), w)) {
      return InvalidArgumentError("job " + options_.job + ": the config places ranks on worker " + std::to_string(w) +
                                  ", which is not a live member (live: " + std::to_string(workers.size()) +
                                  " workers)");
    }
  }
  PTC_ASSIGN_OR_RETURN(std::optional<KeyValue> committed, etcd_->Get(CommittedKey(options_.job)));
  if (!committed) return FailedPreconditionError("job " + options_.job + ": nothing committed yet");
  PTC_ASSIGN_OR_RETURN(Committed c, DecodeCommitted("etcd key " + committed->key, committed->value));
  if (c.generation != from) {
    return FailedPreconditionError("job " + options_.job + ": generation " + std::to_string(from) +
                                   " is no longer committed (" + std::to_string(c.generation) + " is)");
  }
  Change change{NewChangeId(options_.worker), from, from + 1, request, std::move(workers)};
  TxnRequest txn;
  txn.compare = {Compare::Absent(ChangeKey(options_.job)),
                 Compare::ModRevisionIs(CommittedKey(options_.job), committed->mod_revision)};
  txn.success = {TxnOp::DeletePrefix(GenerationPrefix(options_.job, change.generation)),
                 TxnOp::Put(ChangeKey(options_.job), EncodeChange(change))};
  PTC_ASSIGN_OR_RETURN(TxnResponse r, etcd_->Txn(txn));
  if (!r.succeeded) {
    return FailedPreconditionError("job " + options_.job +
                                   ": another change is under way (wait for .ptcfs/status to say serving)");
  }
  return change;
}

void Coordinator::Fail(const Change& change, const Status& error) const {
  Withdraw(change, "worker " + std::to_string(options_.worker) + " failed: " + error.ToString());
}

void Coordinator::Withdraw(const Change& change, const std::string& reason) const {
  auto kv = etcd_->Get(ChangeKey(options_.job));
  if (!kv.ok() || !*kv || (*kv)->value != EncodeChange(change)) return;  // gone already
  (void)Abort(change, (*kv)->mod_revision, reason);
}

Status Coordinator::Abort(const Change& change, int64_t revision, const std::string& reason) const {
  TxnRequest txn;
  txn.compare = {Compare::ModRevisionIs(ChangeKey(options_.job), revision)};
  txn.success = {TxnOp::Delete(ChangeKey(options_.job)),
                 TxnOp::DeletePrefix(PartsPrefix(options_.job, change.generation)),
                 TxnOp::Put(AbortedKey(options_.job, change.generation), EncodeFailure({change.id, reason}))};
  (void)etcd_->Txn(txn);  // lost to another abort or a commit: Aborted() tells which
  return Aborted(change);
}

Status Coordinator::Aborted(const Change& change) const {
  std::string reason = "withdrawn";
  auto kv = etcd_->Get(AbortedKey(options_.job, change.generation));
  if (kv.ok() && *kv) {
    auto f = DecodeFailure("etcd key " + (*kv)->key, (*kv)->value);
    if (f.ok() && f->id == change.id) reason = f->error;
  }
  return FailedPreconditionError("job " + options_.job + ": the change to generation " +
                                 std::to_string(change.generation) + " (" + change.request +
                                 ") was aborted, nothing committed: " + reason);
}

Result<std::vector<ShardRecord>> Coordinator::Finish(const Change& change, const std::string& config,
                                                     const std::vector<ShardRecord>& written,
                                                     const std::vector<ShardRecord>& referenced,
                                                     const std::vector<TensorRecord>& tensors) const {
  auto fixed = [&config](const std::map<int, Part>&) -> Result<std::string> { return config; };
  PTC_ASSIGN_OR_RETURN(auto parts, Finish(change, fixed, Part{written, nlohmann::json::object()}, referenced, tensors,
                                          /*new_contents=*/false));
  std::vector<ShardRecord> others;
  for (auto& [w, part] : parts) {
    if (w != options_.worker) others.insert(others.end(), part.shards.begin(), part.shards.end());
  }
  return others;
}

// What one look of Finish read, and the settle's outcome once every part is in.
struct Coordinator::Round {
  FinishRound observed;            // the commit rule's inputs
  std::map<int, Part> parts;       // this change's parts published, by worker
  int64_t revision = 0;            // etcd's revision of the parts read: the wait watches past it
  int64_t change_revision = 0;     // the change key's, when it stands
  int64_t committed_revision = 0;  // the committed key's
  Committed committed;
  std::string config, digest;  // settled: the new generation's config and the digest of all its pieces
  Status unsettled;            // the settle's error
};

Result<std::map<int, Part>> Coordinator::Finish(const Change& change, const SettleFn& settle, const Part& mine,
                                                const std::vector<ShardRecord>& referenced,
                                                const std::vector<TensorRecord>& tensors, bool new_contents) const {
  // Etcd out of reach (this worker's link cut) is no outcome: the job may
  // commit the part meanwhile (every part was in), and a part this worker gave
  // up is removed from its store. So an IOError is tried again each `poll`
  // until the deadline, when the part is published and while waiting.
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  PTC_RETURN_IF_ERROR(Publish(change, mine, tensors, deadline));
  for (;;) {
    Result<std::optional<std::map<int, Part>>> r = Look(change, settle, referenced, new_contents, deadline);
    if (!r.ok() && Unreachable(r.status(), deadline)) continue;
    PTC_RETURN_IF_ERROR(r.status());
    if (*r) return std::move(**r);
  }
}

bool Coordinator::Unreachable(const Status& s, Clock::time_point deadline) const {
  if (s.code() != Code::kIOError || Clock::now() >= deadline) return false;
  std::this_thread::sleep_for(options_.poll);
  return true;
}

Status Coordinator::Publish(const Change& change, const Part& mine, const std::vector<TensorRecord>& tensors,
                            Clock::time_point deadline) const {
  const std::string& job = options_.job;
  const PartValues values = CutPart(change.id, EncodePart(change.id, mine, tensors), options_.max_value_bytes);
  // Each value while the change stands; the chunks before the head that names them.
  auto put = [&](const std::string& key, const std::string& value) -> Status {
    for (;;) {
      TxnRequest txn;
      txn.compare = {Compare::ValueIs(ChangeKey(job), EncodeChange(change))};
      txn.success = {TxnOp::Put(key, value)};
      Result<TxnResponse> r = etcd_->Txn(txn);  // the same value again when an answer was lost
      if (!r.ok() && Unreachable(r.status(), deadline)) continue;
      return r.status();
    }
  };
  for (size_t i = 0; i < values.chunks.size(); ++i) {
    PTC_RETURN_IF_ERROR(put(PartChunkKey(job, change.generation, options_.worker, i), values.chunks[i]));
  }
  // The change gone: aborted, or committed with the part a lost answer
  // published (the job went on while this worker was cut off). The looks
  // of Finish tell the two apart.
  return put(PartKey(job, change.generation, options_.worker), values.head);
}

Result<std::optional<std::map<int, Part>>> Coordinator::Look(const Change& change, const SettleFn& settle,
                                                             const std::vector<ShardRecord>& referenced,
                                                             bool new_contents, Clock::time_point deadline) const {
  PTC_ASSIGN_OR_RETURN(Round round, Read(change, settle, referenced, deadline));
  const FinishDecision decision = DecideFinish(change, options_.worker, round.observed);
  return Act(change, decision, round, new_contents, deadline);
}

Result<Coordinator::Round> Coordinator::Read(const Change& change, const SettleFn& settle,
                                             const std::vector<ShardRecord>& referenced,
                                             Clock::time_point deadline) const {
  const std::string& job = options_.job;
  Round round;
  // Heads and chunks in one read: a head seen has its chunks.
  PTC_ASSIGN_OR_RETURN(RangeResponse parts, etcd_->GetPrefix(PartsPrefix(job, change.generation)));
  round.revision = parts.revision;
  std::map<int, std::map<size_t, std::string>> chunks;
  for (KeyValue& kv : parts.kvs) {
    if (auto c = PartChunkOf(job, change.generation, kv.key)) chunks[c->first][c->second] = std::move(kv.value);
  }
  for (const KeyValue& kv : parts.kvs) {
    const std::optional<int> w = PartKeyWorker(job, change.generation, kv.key);  // a key naming no worker is no part
    if (!w) continue;
    PTC_ASSIGN_OR_RETURN(auto part, DecodePart("etcd key " + kv.key, kv.value, chunks[*w]));
    if (part.first != change.id) continue;
    round.parts[*w] = std::move(part.second);
    round.observed.parts.insert(*w);
  }
  // The change before the committed state: a commit removes the one and
  // sets the other at once, so a change gone is a commit seen below, or an abort.
  PTC_ASSIGN_OR_RETURN(std::optional<KeyValue> change_kv, etcd_->Get(ChangeKey(job)));
  PTC_ASSIGN_OR_RETURN(std::optional<KeyValue> committed_kv, etcd_->Get(CommittedKey(job)));
  if (!committed_kv) return FailedPreconditionError("job " + job + ": its committed state vanished");
  PTC_ASSIGN_OR_RETURN(round.committed, DecodeCommitted("etcd key " + committed_kv->key, committed_kv->value));
  PTC_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(*etcd_, job));
  round.observed.change_stands = change_kv && change_kv->value == EncodeChange(change);
  round.change_revision = change_kv ? change_kv->mod_revision : 0;
  round.committed_revision = committed_kv->mod_revision;
  round.observed.committed_generation = round.committed.generation;
  for (const Member& m : members) round.observed.members.push_back(m.worker);
  std::sort(round.observed.members.begin(), round.observed.members.end());
  round.observed.past_deadline = Clock::now() > deadline;
  round.observed.timeout = options_.timeout;
  Settle(change, settle, referenced, round);
  return round;
}

void Coordinator::Settle(const Change& change, const SettleFn& settle, const std::vector<ShardRecord>& referenced,
                         Round& round) const {
  // The generation's config and digest, once every part is in.
  if (std::all_of(change.workers.begin(), change.workers.end(), [&](int w) { return round.parts.count(w) > 0; })) {
    Result<std::string> settled = settle(round.parts);
    if (settled.ok()) {
      std::vector<ShardRecord> all = referenced;
      for (const auto& [w, part] : round.parts) all.insert(all.end(), part.shards.begin(), part.shards.end());
      round.config = *std::move(settled);
      round.digest = PiecesDigest(round.config, std::move(all));
    } else {
      round.unsettled = settled.status();
      round.observed.settle_error = round.unsettled.message();
    }
  }
  round.observed.digest_matches = round.unsettled.ok() && round.committed.digest == round.digest;
}

Result<std::optional<std::map<int, Part>>> Coordinator::Act(const Change& change, const FinishDecision& decision,
                                                            Round& round, bool new_contents,
                                                            Clock::time_point deadline) const {
  using Parts = std::optional<std::map<int, Part>>;
  const std::string& job = options_.job;
  switch (decision.action) {
    case FinishAction::kDone:
      return Parts(std::move(round.parts));
    case FinishAction::kCorrupt:
      return CorruptionError("job " + job + ": generation " + std::to_string(change.generation) +
                             " was committed with pieces " + round.committed.digest + ", this worker has " +
                             (round.unsettled.ok() ? round.digest : "none: " + round.unsettled.message()));
    case FinishAction::kAborted:
      return Aborted(change);
    case FinishAction::kCommit: {
      TxnRequest txn;
      txn.compare = {Compare::ModRevisionIs(ChangeKey(job), round.change_revision),
                     Compare::ModRevisionIs(CommittedKey(job), round.committed_revision)};
      const std::string contents = new_contents ? round.digest : round.committed.contents;
      txn.success = {
          TxnOp::Put(CommittedKey(job), EncodeCommitted({change.generation, round.config, round.digest, contents})),
          TxnOp::Delete(ChangeKey(job)), TxnOp::DeletePrefix(GenerationPrefix(job, change.from))};
      PTC_RETURN_IF_ERROR(etcd_->Txn(txn).status());
      return Parts();  // committed here or by another worker: the next look sees it
    }
    case FinishAction::kAbort:
      return Abort(change, round.change_revision, decision.reason);
    case FinishAction::kLookAgain:
      return Parts();
    case FinishAction::kWait:
      break;
  }
  // Until etcd holds anything newer than this look read (a part, an abort,
  // a member gone), at most `poll`; a sleep when the watch fails.
  const auto wait = std::min<Clock::duration>(options_.poll, deadline - Clock::now());
  const auto wait_ms = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(1),
                                                           std::chrono::duration_cast<std::chrono::milliseconds>(wait));
  if (!etcd_->WaitForChange(JobPrefix(job), round.revision, wait_ms).ok()) {
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(wait_ms, kPollWithoutWatch));
  }
  return Parts();
}

}  // namespace ptc::cluster
