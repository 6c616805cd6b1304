// A worker's server of the peer data plane (peer_protocol.h, docs/cluster.md):
// serves byte ranges of the shard files of one store to the job's other
// workers over HTTP, on its own threads.
//
// Every request must carry the job's token (token.h); only the data of shard
// records of the served generations is reachable (served_files.h): the
// store's current generation, read at each request, and the generations
// given to SetKeptGenerations. A request for anything else is refused before
// any file is opened. Responses are streamed from the file in chunks of
// 1 MiB: memory per request is bounded whatever its length.
//
// Slow clients: a connection holds no worker until its request head is in
// (head_gate.h); one that has not sent it all `head_timeout` after it was
// accepted is closed, idle or trickling. So idle and slowloris connections
// delay no request; they cost a descriptor each, for at most head_timeout,
// and at most `max_waiting` wait at once (the longest waiting is closed to
// admit one more). The listen backlog is SOMAXCONN.
//
// Thread safety: all methods may be called from any thread. The Store must
// outlive the server.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cluster/peer_protocol.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store.h"

namespace ptc::cluster {

struct PeerServerOptions {
  std::string address = "127.0.0.1";  // the address to bind (0.0.0.0: every interface)
  int port = 0;                       // 0: a free port (PeerServer::address() tells which)
  std::string token;                  // the shared token (ReadTokenFile); ValidateToken must accept it
  uint64_t max_request_bytes = kDefaultMaxRequestBytes;  // larger requests: 413
  int threads = 8;                                       // requests served at once
  int worker = -1;  // >= 0: serve only this worker's shard files (a cluster worker's own)
  std::chrono::seconds io_timeout{10};                   // per socket write (a response's)
  // From accept to a request head's last byte (a kept-alive connection's next
  // head: from its first byte); a request body must follow as promptly.
  std::chrono::milliseconds head_timeout{2000};
  size_t max_waiting = 512;  // connections waiting for their request head at once
};

// Counters since Start.
struct PeerServerStats {
  uint64_t served = 0;        // requests answered 200
  uint64_t refused = 0;       // requests answered with an error status
  uint64_t files_opened = 0;  // shard files opened
  uint64_t bytes_sent = 0;    // shard bytes in 200 responses
  uint64_t head_timeouts = 0;  // connections closed without a complete request head by head_timeout
  uint64_t evicted = 0;        // connections closed waiting for their head: max_waiting others were
};

class PeerServer {
 public:
  // Binds to options.address:options.port and starts serving `store`.
  // \error InvalidArgument when the token fails ValidateToken (the token is not
  //        shown), max_request_bytes is 0, threads < 1, head_timeout is not
  //        positive or max_waiting < 1.
  // \error IOError naming ADDRESS:PORT when it cannot bind or listen.
  static Result<std::unique_ptr<PeerServer>> Start(const Store* store, PeerServerOptions options);
  // Stop().
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // The bound address and port.
  PeerAddress address() const;

  // Also serves these generations (kept for open files, or being pulled);
  // replaces the previous list. The current generation is always served.
  void SetKeptGenerations(std::vector<std::shared_ptr<const GenerationManifest>> kept);

  // Also serves `part`, the pieces this worker wrote for a change of the job
  // (its part, made durable and published), until the store's current
  // generation reaches part->generation: a worker that committed the change
  // before this one did may pull them at once. Replaces the previous part.
  void ServePart(std::shared_ptr<const GenerationManifest> part);

  // Serves `bytes` as `name` (GET kPublishedPath) until Withdraw(name);
  // replaces what was published under that name.
  void Publish(const std::string& name, std::shared_ptr<const std::string> bytes);
  void Withdraw(const std::string& name);
  // What is published as `name`, or nullptr.
  std::shared_ptr<const std::string> Published(const std::string& name) const;

  PeerServerStats stats() const;

  // Stops accepting, ends the connections and joins every thread of the
  // server. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit PeerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptc::cluster
