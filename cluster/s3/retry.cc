#include "cluster/s3/retry.h"

#include <algorithm>

namespace ptc::cluster::s3 {

bool Transient(int http_status) {
  return http_status == 0 || http_status == 500 || http_status == 502 || http_status == 503 || http_status == 504;
}

std::chrono::milliseconds Backoff(const RetryPolicy& policy, int attempt, double random) {
  const int shift = std::clamp(attempt - 1, 0, 30);
  const int64_t ceiling = std::min<int64_t>(policy.cap.count(), policy.base.count() << std::min(shift, 20));
  return std::chrono::milliseconds(static_cast<int64_t>(random * static_cast<double>(ceiling)));
}

}  // namespace ptc::cluster::s3
