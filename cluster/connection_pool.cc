#include "cluster/connection_pool.h"

#include <poll.h>
#include <unistd.h>

namespace ptc::cluster {
namespace {

// True when nothing is readable on an idle connection: a connection the
// peer closed reads as readable (end of stream), and so does one it sent
// anything on, which no request asked for.
bool QuietAndOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

ConnectionPool::ConnectionPool(ConnectionPoolOptions options) : options_(options) {}

ConnectionPool::~ConnectionPool() {
  MutexLock lock(&mu_);
  for (auto& [peer, kept] : kept_) {
    for (const Kept& k : kept) ::close(k.fd);
  }
}

int ConnectionPool::Take(const PeerAddress& peer) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<int> closing;
  int fd = -1;
  {
    MutexLock lock(&mu_);
    auto it = kept_.find(peer.ToString());
    while (it != kept_.end() && !it->second.empty() && fd < 0) {
      const Kept k = it->second.back();
      it->second.pop_back();
      if (now - k.since <= options_.idle && QuietAndOpen(k.fd)) {
        fd = k.fd;
        stats_.reuses++;
      } else {
        closing.push_back(k.fd);
        stats_.stale += now - k.since <= options_.idle ? 1 : 0;
      }
    }
  }
  for (int c : closing) ::close(c);
  return fd;
}

void ConnectionPool::Put(const PeerAddress& peer, int fd) {
  {
    MutexLock lock(&mu_);
    std::vector<Kept>& kept = kept_[peer.ToString()];
    if (kept.size() < options_.per_peer) {
      kept.push_back({fd, std::chrono::steady_clock::now()});
      return;
    }
  }
  ::close(fd);
}

void ConnectionPool::CountConnect() {
  MutexLock lock(&mu_);
  stats_.connects++;
}

void ConnectionPool::CountStale() {
  MutexLock lock(&mu_);
  stats_.stale++;
}

ConnectionPoolStats ConnectionPool::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ptc::cluster
