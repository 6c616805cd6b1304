// When an S3 request is tried again (AWS's "Retry behavior" and "Error
// retries and exponential backoff"): no answer at all (the connection
// refused or cut, a timeout), 500, 502, 503 (SlowDown among them) and 504
// are transient; every other answer is final. Waits double from `base` up
// to `cap`, with full jitter, for at most `attempts` tries.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>

namespace ptc::cluster::s3 {

struct RetryPolicy {
  int attempts = 6;
  std::chrono::milliseconds base{100};
  std::chrono::milliseconds cap{5000};
};

// Whether an answer with this HTTP status (0: none came) is worth another try.
bool Transient(int http_status);
// The wait before try `attempt` + 1 (attempt counts from 1), given `random`
// uniform in [0, 1): random * min(cap, base * 2^(attempt-1)).
std::chrono::milliseconds Backoff(const RetryPolicy& policy, int attempt, double random);

}  // namespace ptc::cluster::s3
