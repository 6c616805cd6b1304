// Connections to peers kept open between HTTP/1.1 requests (keep-alive), for
// the data plane's client (http_get.h, peer_client.h): a request takes a kept
// connection to its peer when there is one and gives it back once its
// response was read whole, so that a sweep of many span requests connects
// once per peer and concurrent request, not once per request.
//
// Bounded: at most `per_peer` idle connections per peer are kept (one more
// given back is closed); one idle longer than `idle` is closed rather than
// used (the peer server ends a kept-alive connection after 2 s without a
// request: peer_server.cc), and so is one the peer has closed or sent
// anything on meanwhile (checked with a poll when taken). A kept connection
// can still be closed by the peer between that check and the request: the
// caller then tries once more on a fresh one (HttpGet).
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cluster/peer_protocol.h"
#include "ptc/base/mutex.h"

namespace ptc::cluster {

struct ConnectionPoolOptions {
  size_t per_peer = 4;                   // idle connections kept per peer (0: none kept)
  std::chrono::milliseconds idle{1000};  // kept no longer than this unused
};

// Counters since construction.
struct ConnectionPoolStats {
  uint64_t connects = 0;  // connections opened
  uint64_t reuses = 0;    // requests sent on a kept connection
  uint64_t stale = 0;     // kept connections found closed by the peer (at Take, or by the request sent on it)
};

class ConnectionPool {
 public:
  explicit ConnectionPool(ConnectionPoolOptions options = {});
  // Closes the kept connections.
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A kept connection to `peer` that still looks open (the caller owns it
  // now; counted as a reuse), or -1.
  int Take(const PeerAddress& peer) EXCLUDES(mu_);
  // Keeps `fd`, a connection to `peer` whose last response was read whole
  // and that the peer did not say it closes, or closes it when per_peer are
  // kept already. Takes ownership.
  void Put(const PeerAddress& peer, int fd) EXCLUDES(mu_);

  void CountConnect() EXCLUDES(mu_);
  // A connection Take gave that the peer had closed before the request.
  void CountStale() EXCLUDES(mu_);
  ConnectionPoolStats stats() const EXCLUDES(mu_);

 private:
  struct Kept {
    int fd;
    std::chrono::steady_clock::time_point since;
  };
  const ConnectionPoolOptions options_;
  mutable Mutex mu_;
  std::map<std::string, std::vector<Kept>> kept_ GUARDED_BY(mu_);  // by PeerAddress::ToString, most recent last
  ConnectionPoolStats stats_ GUARDED_BY(mu_);
};

}  // namespace ptc::cluster
