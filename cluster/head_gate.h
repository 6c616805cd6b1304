// The peer server's front door (peer_server.h): accepts TCP connections and
// holds each one, on a thread of its own and without taking a worker, until
// its request head (up to the empty line "\r\n\r\n") has arrived; only then
// is the connection handed on, to be served. A connection whose head is not
// complete by the head deadline is closed, however steadily it trickles
// bytes: idle and slowloris clients cost a descriptor for a bounded time,
// never a worker (cpp-httplib's own accept loop gives each connection a
// worker that waits on it, and a listen backlog of 5).
//
// Thread safety: Return, stats and Stop may be called from any thread.
// `ready` is called on the gate's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ptc/base/status.h"

namespace ptc::cluster {

struct HeadGateOptions {
  // From accept to the head's last byte; for a kept-alive connection, from
  // the first byte of its next request.
  std::chrono::milliseconds head_timeout{2000};
  // A kept-alive connection's wait for the first byte of its next request.
  std::chrono::milliseconds keep_alive_timeout{2000};
  // Longer heads: the connection is closed.
  size_t max_head_bytes = 16 << 10;
  // Connections waiting for a head at once; one more closes the one that has
  // waited longest.
  size_t max_waiting = 512;
};

// A connection whose request head is complete.
struct ReadyConnection {
  int fd = -1;        // non-blocking; the receiver's: Return it to the gate or close it
  std::string bytes;  // received and not yet consumed: the head, then what followed it
  int requests = 0;   // requests served on it before this one
};

struct HeadGateStats {
  uint64_t accepted = 0;       // connections accepted
  uint64_t head_timeouts = 0;  // closed: no complete head by the deadline
  uint64_t evicted = 0;        // closed: max_waiting others were waiting
  uint64_t oversized = 0;      // closed: a head longer than max_head_bytes
};

// The position just past the head's final "\r\n\r\n" in `bytes`, searching
// from `from` (bytes already searched); 0 while the head is incomplete.
size_t HeadEnd(const std::string& bytes, size_t from);

class HeadGate {
 public:
  using Ready = std::function<void(ReadyConnection)>;

  // Listens on address:port (port 0: a free one; SO_REUSEADDR, a backlog of
  // SOMAXCONN); connections queue until Start.
  // \error IOError naming ADDRESS:PORT when the address does not resolve or
  //        no socket of it can bind and listen.
  static Result<std::unique_ptr<HeadGate>> Listen(const std::string& address, int port, HeadGateOptions options);
  // Stop().
  ~HeadGate();
  HeadGate(const HeadGate&) = delete;
  HeadGate& operator=(const HeadGate&) = delete;

  // The bound port.
  int port() const;

  // Starts accepting on the gate's thread; each connection whose head is
  // complete goes to `ready`. Once.
  void Start(Ready ready);

  // A connection back after a response, kept alive: it waits here for its
  // next head (bytes already received count towards it). After Stop: closed.
  void Return(ReadyConnection c);

  HeadGateStats stats() const;

  // Closes the listening socket and every waiting connection and joins the
  // thread; `ready` is not called once it returns. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HeadGate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptc::cluster
