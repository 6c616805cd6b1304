#include "cluster/rejoin.h"

#include "cluster/membership.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/shard_verify.h"

namespace ptc::cluster {

bool AtCommitted(const Store& store, const Committed& committed) {
  auto current = store.CurrentSnapshot();
  return current != nullptr && current->generation == committed.generation && current->config == committed.config &&
         PiecesDigest(current->config, current->shards) == committed.digest;
}

Result<GenerationManifest> FetchCommitted(const KvStore& etcd, const std::string& job, int skip,
                                          const Committed& committed, const PeerClient& client) {
  PTC_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(etcd, job));
  std::string answers;
  for (const Member& m : members) {
    if (m.worker == skip) continue;
    auto address = ParsePeerAddress(m.address);
    Result<GenerationManifest> got =
        address.ok() ? client.FetchManifest(*address, committed.generation) : Result<GenerationManifest>(address.status());
    if (got.ok() && (got->config != committed.config ||
                     PiecesDigest(got->config, got->shards) != committed.digest)) {
      got = CorruptionError("its generation " + std::to_string(committed.generation) + " is not the one etcd committed");
    }
    if (got.ok()) return got;
    answers += "; worker " + std::to_string(m.worker) + ": " + got.status().message();
  }
  return FailedPreconditionError("job " + job + ": no live worker serves generation " +
                                 std::to_string(committed.generation) +
                                 (answers.empty() ? std::string(" (no other worker is live)") : answers));
}

Status CatchUp(const KvStore& etcd, const std::string& job, int worker, const Committed& committed,
               const PeerClient& client, Store& store) {
  const std::string who = "worker " + std::to_string(worker) + " of job " + job + ": bringing the store to generation " +
                          std::to_string(committed.generation);
  PTC_ASSIGN_OR_RETURN(GenerationManifest manifest, FetchCommitted(etcd, job, worker, committed, client), who);
  // The pieces the job keeps on this worker must be here, intact.
  size_t lacking = 0;
  std::string first;
  for (const ShardRecord& s : manifest.shards) {
    if (s.worker != worker) continue;
    Status held = VerifyShard(Env::Default(), store, s);
    if (!held.ok() && lacking++ == 0) first = held.message();
  }
  if (lacking > 0) {
    return FailedPreconditionError(who + ": the job keeps " + std::to_string(lacking) +
                                   " pieces on this worker that its store lacks or holds damaged (first: " + first +
                                   "); mount with this worker's own store, or give it a new worker id");
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<GenerationWriter> writer, store.BeginGenerationAt(committed.generation), who);
  for (const ShardRecord& s : manifest.shards) writer->AddShard(s);
  GenerationManifest meta = std::move(manifest);
  meta.shards.clear();
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)), who);
  return Status::OK();
}

std::vector<Compare> RejoinConditions(const std::string& job, const std::string& committed_value) {
  return {Compare::ValueIs(CommittedKey(job), committed_value), Compare::Absent(ChangeKey(job))};
}

}  // namespace ptc::cluster
