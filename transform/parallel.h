// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads and
// returns the first error; after an error no new index is started.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "ptc/base/mutex.h"
#include "ptc/base/status.h"

namespace ptc::transform {

// As below, and fn also gets the index in [0, threads) of the thread that runs
// it, so that a caller can keep one scratch buffer per thread.
inline Status ParallelFor(size_t n, int threads, const std::function<Status(size_t i, int thread)>& fn) {
  // The first error any thread met (a struct: locals cannot be GUARDED_BY).
  struct FirstError {
    Mutex mu;
    Status status GUARDED_BY(mu);
  } first;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&](int thread) {
    for (size_t i; !failed && (i = next++) < n;) {
      Status s = fn(i, thread);
      if (!s.ok()) {
        MutexLock lock(&first.mu);
        if (first.status.ok()) first.status = s;
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
  MutexLock lock(&first.mu);
  return first.status;
}

inline Status ParallelFor(size_t n, int threads, const std::function<Status(size_t)>& fn) {
  return ParallelFor(n, threads, [&](size_t i, int) { return fn(i); });
}

}  // namespace ptc::transform
