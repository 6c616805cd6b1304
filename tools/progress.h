// A progress line on stderr for long work: bytes done / total, percent, rate
// and ETA, redrawn at most every 200 ms. Silent when stderr is not a terminal
// (or PTCFS_PROGRESS=0), so scripts and logs stay clean; PTCFS_PROGRESS=1
// forces it on.
//
// Thread safety: Add may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "ptc/base/mutex.h"

namespace ptcfs {

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes);
  ~Progress();  // ends the line when anything was drawn

  void Add(uint64_t bytes) EXCLUDES(mu_);
  // A callable for ptc::ProgressFn.
  auto fn() {
    return [this](uint64_t bytes) { Add(bytes); };
  }

 private:
  void Draw(bool final);

  const std::string label_;
  const uint64_t total_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  ptc::Mutex mu_;  // held only to decide whether to draw; Draw runs outside it
  std::chrono::steady_clock::time_point last_draw_ GUARDED_BY(mu_);
  bool drawn_ GUARDED_BY(mu_) = false;
};

// "1.5 GiB", "340 KiB", "12 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace ptcfs
