// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads and
// returns the first error; after an error no new index is started.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ptc/status.h"

namespace ptc {

inline Status ParallelFor(size_t n, int threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;  // GUARDED_BY(mu)
  auto work = [&] {
    for (size_t i; !failed && (i = next++) < n;) {
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return first;
}

}  // namespace ptc
