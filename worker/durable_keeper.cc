#include "worker/durable_keeper.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cluster/durable.h"
#include "cluster/durable_restore.h"

namespace ptcfs::worker {
namespace {

// How often the tier is looked at again while it holds no usable copy and
// this worker's share is in (another worker's may still be on its way).
constexpr std::chrono::seconds kLookEvery{5};
// How long after a failed copy (the tier unreachable: a bucket's server
// away) the same generation's share is copied again.
constexpr std::chrono::seconds kRetryAfter{10};

}  // namespace

DurableKeeper::~DurableKeeper() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void DurableKeeper::Look() {
  const auto now = std::chrono::steady_clock::now();
  auto current = fs_->store().CurrentSnapshot();
  if (complete_ == current->generation || busy_ || now < next_look_) return;
  auto job = coordinator_->GetCommitted();
  if (!job.ok() || !*job || current->generation != (*job)->generation) return;
  const std::string& contents = (*job)->contents;
  bool known;
  {
    ptc::MutexLock lock(&mu_);
    known = complete_contents_ == contents;
  }
  if (known) {  // a change of layout: the copy serves the new generation too
    if (!Records(*current)) {
      Complete(current->generation, contents);
      return;
    }
    if (thread_.joinable()) thread_.join();
    busy_ = true;
    thread_ = std::thread([this, current, contents] {
      RecordJob(*current, contents);  // first: once the status says complete, the tier's records are
      Complete(current->generation, contents);
      busy_ = false;
    });
    return;
  }
  next_look_ = now + kLookEvery;
  if (failed_.exchange(false)) {
    copied_ = 0;  // the failed copy is made again
    next_look_ = now + kRetryAfter;
    return;
  }
  const bool copy = copied_ != current->generation;
  copied_ = current->generation;
  if (thread_.joinable()) thread_.join();  // the previous round, ended
  // The tier is looked at on the round's thread too: a bucket's server away
  // keeps a request for seconds of retries, and the agent's loop must not wait.
  busy_ = true;
  thread_ = std::thread([this, current, contents, copy] {
    if (ptc::cluster::LoadDurable(tier_env(), tier_.dir, {job_, contents}, current->tensors).ok()) {
      RecordJob(*current, contents);
      Complete(current->generation, contents);
    } else if (copy) {
      copying_ = true;
      Copy(current, contents);
    }
    busy_ = false;
  });
}

bool DurableKeeper::Records(const ptc::GenerationManifest& generation) const {
  int lowest = -1;
  for (const ptc::ShardRecord& s : generation.shards) lowest = lowest < 0 ? s.worker : std::min(lowest, s.worker);
  return lowest == worker_;
}

void DurableKeeper::RecordJob(const ptc::GenerationManifest& generation, const std::string& contents) {
  if (!Records(generation) || recorded_ == generation.generation) return;
  const ptc::cluster::JobRecord r{job_, generation.generation, generation.config, contents};
  ptc::Status s = ptc::WriteFileAtomic(tier_env(), ptc::JoinPath(tier_.dir, ptc::cluster::kJobRecord),
                                       ptc::cluster::EncodeJobRecord(r));
  if (s.ok()) {
    recorded_ = generation.generation;
  } else {
    std::fprintf(stderr, "ptcfs: durable tier %s: the job's record of generation %llu not written (%s)\n",
                 tier_.name.c_str(), static_cast<unsigned long long>(generation.generation), s.ToString().c_str());
  }
}

void DurableKeeper::Complete(uint64_t generation, const std::string& contents) {
  ptc::MutexLock lock(&mu_);
  complete_contents_ = contents;
  complete_ = generation;
}

nlohmann::json DurableKeeper::Report() const {
  const bool complete = complete_ == fs_->store().CurrentSnapshot()->generation;
  std::string error;
  {
    ptc::MutexLock lock(&mu_);
    error = error_;
  }
  const char* copy = complete ? "complete" : copying_ ? "copying" : !error.empty() ? "behind" : "incomplete";
  nlohmann::json j = {{"dir", tier_.name}, {"copy", copy}, {"complete_generation", nullptr}};
  if (complete_ != 0) j["complete_generation"] = complete_.load();
  if (!complete && !error.empty()) j["error"] = error;
  return j;
}

void DurableKeeper::Copy(std::shared_ptr<const ptc::GenerationManifest> generation, std::string contents) {
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);  // best effort, as a compaction
  const auto t0 = std::chrono::steady_clock::now();
  ptc::Status s = ptc::cluster::WriteDurableShare(env_, fs_->store(), *generation, worker_, tier_.dir, &stop_, tier_env());
  ptc::Result<bool> complete =
      s.ok() ? ptc::cluster::CompleteDurable(tier_env(), *generation, {job_, contents}, worker_, tier_.dir) : s;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool moved_on = fs_->store().CurrentSnapshot()->generation != generation->generation;
  if (!complete.ok() && (stop_ || moved_on)) {
    // Unmounted, or the job moved on (its files may be collected under the
    // copy): the next generation is copied instead.
    std::fprintf(stderr, "ptcfs: durable tier %s: the copy of generation %llu ended (%s)\n", tier_.name.c_str(),
                 static_cast<unsigned long long>(generation->generation), stop_ ? "unmounted" : "the job moved on");
  } else if (!complete.ok()) {
    const std::string error = "durable tier " + tier_.name + ": " + complete.status().message();
    std::fprintf(stderr, "ptcfs: %s (tried again in %lld s)\n", error.c_str(),
                 static_cast<long long>(kRetryAfter.count()));
    fs_->controller().RecordError(error);
    {
      ptc::MutexLock lock(&mu_);
      error_ = error + " (the copy of generation " + std::to_string(generation->generation) + ")";
    }
    failed_ = true;
  } else {
    {
      ptc::MutexLock lock(&mu_);
      error_.clear();
    }
    if (*complete) {
      RecordJob(*generation, contents);
      Complete(generation->generation, contents);
    }
    std::fprintf(stderr, "ptcfs: worker %d: its share of generation %llu is in the durable tier %s (%.1f s)%s\n",
                 worker_, static_cast<unsigned long long>(generation->generation), tier_.name.c_str(), seconds,
                 *complete ? "; the copy is complete" : "");
  }
  copying_ = false;
}

}  // namespace ptcfs::worker
