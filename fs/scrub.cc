#include "fs/scrub.h"

#include <utility>
#include <vector>

#include "ptc/base/utc_time.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/shard_verify.h"

namespace ptcfs {
namespace {

constexpr size_t kReadSize = size_t{4} << 20;  // one checksum block a read

}  // namespace

Scrubber::Scrubber(const ptc::Store* store, ScrubOptions options, std::function<void(const std::string&)> report)
    : store_(store), options_(options), report_(std::move(report)) {}

void Scrubber::Start() {
  if (options_.enabled && !thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

Scrubber::~Scrubber() {
  {
    ptc::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Scrubber::Serve(std::shared_ptr<const Snapshot> snap) {
  ptc::MutexLock lock(&mu_);
  serving_ = std::move(snap);
  due_ = true;
  wake_.SignalAll();
}

bool Scrubber::IsBad(const std::string& path) const {
  ptc::MutexLock lock(&mu_);
  return bad_.count(path) != 0;
}

nlohmann::json Scrubber::StatusJson() const {
  ptc::MutexLock lock(&mu_);
  if (!options_.enabled) return {{"state", "off"}};
  return {{"state", running_ ? "running" : "idle"},
          {"interval_seconds", options_.interval.count()},
          {"rate", options_.rate},
          {"passes", passes_},
          {"bytes_checked", bytes_checked_},
          {"last_pass", last_pass_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_pass_)},
          {"bad_files", bad_}};
}

void Scrubber::Loop() {
  while (true) {
    std::shared_ptr<const Snapshot> snap;
    {
      ptc::MutexLock lock(&mu_);
      const auto next = std::chrono::steady_clock::now() + options_.interval;
      while (!stop_ && !due_) {
        if (options_.interval.count() > 0 && serving_ != nullptr) {
          if (!wake_.WaitUntil(next) && std::chrono::steady_clock::now() >= next) due_ = true;
        } else {
          wake_.Wait();
        }
      }
      if (stop_) return;
      due_ = false;
      snap = serving_;
      running_ = true;
    }
    const bool whole = Pass(snap);
    ptc::MutexLock lock(&mu_);
    running_ = false;
    if (whole) {
      ++passes_;
      last_pass_ = ptc::UtcNowText();
    }
  }
}

bool Scrubber::Pass(const std::shared_ptr<const Snapshot>& snap) {
  const ptc::GenerationManifest& m = snap->reader().manifest();
  std::vector<ptc::ShardRecord> records;
  for (const ptc::ShardRecord* s : ptc::DistinctPieces(m)) records.push_back(*s);
  for (ptc::ShardRecord& c : ptc::CopyRecords(m)) records.push_back(std::move(c));
  // The worker's own files only: a local read, never a pull from a peer.
  ptc::Env* local = ptc::Env::Default();
  std::vector<char> buffer(kReadSize);
  for (const ptc::ShardRecord& r : records) {
    {
      ptc::MutexLock lock(&mu_);
      if (bad_.count(r.file) != 0) continue;
    }
    if (!local->Exists(store_->AbsPath(r.file))) continue;
    auto reader = ptc::VerifyingShardReader::Open(local, *store_, r);
    ptc::Status s = reader.status();
    for (uint64_t done = 0; s.ok() && done < r.nbytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kReadSize, r.nbytes - done));
      if (!Throttle(n, snap->generation())) return false;
      s = (*reader)->Read(n, buffer.data());
      done += n;
    }
    if (s.ok()) s = (*reader)->Finish();
    if (s.ok() || s.code() == ptc::Code::kNotFound) continue;  // removed meanwhile (a newer generation's collection)
    {
      ptc::MutexLock lock(&mu_);
      if (serving_ != snap) return false;  // replaced: the file may be gone, not bad
      bad_.insert(r.file);
    }
    report_("scrub: " + s.message() + "; " + r.file + " is served by the daemon from now on, not the kernel");
  }
  return true;
}

bool Scrubber::Throttle(uint64_t bytes, uint64_t generation) {
  ptc::MutexLock lock(&mu_);
  const auto now = std::chrono::steady_clock::now();
  if (window_bytes_ == 0 || now - window_start_ > std::chrono::seconds(1)) {
    window_start_ = now;
    window_bytes_ = 0;
  }
  window_bytes_ += bytes;
  bytes_checked_ += bytes;
  // At `rate`, window_bytes_ may be read by window_start_ + window_bytes_ / rate.
  const auto due =
      window_start_ + std::chrono::microseconds(window_bytes_ * 1000000 / std::max<uint64_t>(1, options_.rate));
  while (!stop_ && std::chrono::steady_clock::now() < due) {
    if (serving_ && serving_->generation() != generation) return false;
    wake_.WaitUntil(due);
  }
  return !stop_ && (!serving_ || serving_->generation() == generation);
}

}  // namespace ptcfs
