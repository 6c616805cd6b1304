#include "worker/tier_restore.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cluster/durable_restore.h"
#include "cluster/keys.h"
#include "cluster/membership.h"

namespace ptcfs::worker {

ptc::Result<std::optional<TierRestore>> RestoreFromTier(const WorkerOptions& o, const ptc::cluster::KvStore& kv,
                                  const ptc::cluster::Coordinator& coordinator,
                                  const std::optional<ptc::cluster::Committed>& job, ptc::Store& store) {
  namespace cl = ptc::cluster;
  if (store.has_generation() || o.durable.empty()) return std::nullopt;
  std::string resume;
  std::vector<cl::Member> live;
  if (job) {
    PTC_ASSIGN_OR_RETURN(live, cl::ListMembers(kv, o.job));
  }
  auto copy = cl::ReadDurableCopy(o.durable, o.job);
  // No copy, or the tier away while live workers serve the job: catching up says what is wrong.
  if (!copy.ok() && (copy.status().code() == ptc::Code::kNotFound || !live.empty())) return std::nullopt;
  PTC_RETURN_IF_ERROR(copy.status());
  uint64_t generation = copy->manifest.generation + 1;
  std::optional<std::string> replace;  // the lost job's committed value
  if (job) {
    if (job->contents != copy->id.contents) return std::nullopt;  // an older copy: catching up says why
    PTC_ASSIGN_OR_RETURN(ptc::GenerationManifest again, cl::RestoredManifest(copy->manifest, job->generation));
    const bool restored_already =
        again.config == job->config && cl::PiecesDigest(again.config, again.shards) == job->digest;
    if (restored_already) {
      generation = job->generation;
    } else {
      if (!live.empty()) return std::nullopt;  // a live worker serves the job: catch up from it
      PTC_ASSIGN_OR_RETURN(std::optional<cl::KeyValue> value, kv.Get(cl::CommittedKey(o.job)));
      if (!value) return std::nullopt;
      replace = value->value;
      generation = job->generation + 1;
      resume = job->config;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  PTC_ASSIGN_OR_RETURN(ptc::GenerationManifest restored, cl::RestoredManifest(copy->manifest, generation));
  PTC_RETURN_IF_ERROR(cl::RestoreShare(o.durable, copy->manifest, restored, o.worker, store));
  uint64_t bytes = 0;
  for (const ptc::ShardRecord& s : restored.shards) bytes += s.worker == o.worker ? s.nbytes : 0;
  std::fprintf(stderr,
               "ptcfs: worker %d: restored generation %llu of job %s from the durable tier %s (%s, the copy of "
               "generation %llu; %llu bytes of its own in %.1f s)\n",
               o.worker, static_cast<unsigned long long>(generation), o.job.c_str(), o.durable.name.c_str(),
               restored.config.c_str(), static_cast<unsigned long long>(copy->manifest.generation),
               static_cast<unsigned long long>(bytes),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  PTC_RETURN_IF_ERROR(coordinator.Join(store.current(), copy->id.contents, replace));
  if (resume.empty() && copy->latest) resume = copy->latest->config;
  if (resume == restored.config) resume.clear();
  return TierRestore{generation, resume};
}

}  // namespace ptcfs::worker
