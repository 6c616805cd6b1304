// A worker's client of the peer data plane (peer_protocol.h, docs/cluster.md):
// reads byte ranges of shards that another worker stores, checking them
// against the manifest's block checksums as they arrive.
//
// A range is widened to the checksum blocks (ptc/base/checksum.h,
// kChecksumBlockBytes) that hold it: those blocks are fetched whole (in
// requests of at most max_request_bytes), hashed as they stream in, and only
// the asked part is copied out; nothing is buffered beyond one network read.
//
// Connections are kept per peer between requests (connection_pool.h,
// options.pool): a sweep of span requests connects about once per peer and
// concurrent request. A kept connection the peer closed is replaced by a
// fresh one for the same request; a request broken mid-response is tried
// again (attempts) on a fresh one.
//
// Thread safety: every method may be called from any thread concurrently;
// each request has a connection to itself while it runs. Copies share the
// kept connections.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cluster/connection_pool.h"
#include "cluster/peer_protocol.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"

namespace ptc::cluster {

struct PeerClientOptions {
  std::string token;  // the job's token (token.h)
  // The deadline of one ReadShardRange, every request and retry included.
  std::chrono::milliseconds timeout{30000};
  // Tries per request: a connection failure, a broken or short response is
  // tried again (the same bytes: requests are idempotent) until the deadline.
  int attempts = 3;
  // The longest the peer may send nothing (HttpGetRequest::stall): a peer
  // whose link was cut fails each attempt after this, not at the deadline.
  std::chrono::milliseconds stall{3000};
  // Bytes per request, a multiple of kChecksumBlockBytes, at most the server's limit.
  uint64_t max_request_bytes = kDefaultMaxRequestBytes;
  // Connections kept per peer between requests (pool.per_peer 0: a
  // connection per request, "Connection: close", as before keep-alive).
  ConnectionPoolOptions pool{};
};

class PeerClient {
 public:
  explicit PeerClient(PeerClientOptions options);

  // Copies bytes [offset_in_shard, offset_in_shard + length) of `shard`'s data,
  // as `peer` stores it, into dst, after checking every checksum block they
  // touch against `shard` (the record of the manifest both workers share).
  // On an error dst holds unspecified bytes. length 0 sends nothing.
  // Every error names the peer and the shard (tensor, boxes, file):
  // \error InvalidArgument when the range leaves the shard, or the options are
  //        unusable (max_request_bytes not a positive multiple of
  //        kChecksumBlockBytes, attempts < 1); or the peer refuses the request
  //        as malformed or out of range (400, 413, 416).
  // \error PermissionDenied when the peer refuses the token (401, 403).
  // \error NotFound when the peer serves no such file (404).
  // \error Corruption naming the block when a block received differs from its checksum.
  // \error IOError when the peer cannot be reached, answers otherwise, sends
  //        too few or too many bytes, or the deadline passes (after the attempts).
  Status ReadShardRange(const PeerAddress& peer, const ShardRecord& shard, uint64_t offset_in_shard, uint64_t length,
                        void* dst) const;

  // The manifest of `generation` as `peer` serves it (GET /v1/manifest),
  // decoded and validated (DecodeManifest).
  // \error NotFound when the peer does not serve that generation;
  //        PermissionDenied as above; Corruption for a manifest that does not
  //        decode or is of another generation; IOError as above.
  Result<GenerationManifest> FetchManifest(const PeerAddress& peer, uint64_t generation) const;

  // What `peer` publishes as `name` (GET /v1/published), which must be `bytes`
  // long with xxh64 `checksum` (the deadline: the timeout, plus a second per 8 MiB).
  // \error NotFound when the peer publishes nothing of that name; Corruption
  //        naming the peer and the name when what arrives has another length or
  //        checksum; PermissionDenied and IOError as above.
  Result<std::string> FetchPublished(const PeerAddress& peer, const std::string& name, uint64_t bytes,
                                     uint64_t checksum) const;

  // The kept connections' counters (all zero without a pool).
  ConnectionPoolStats pool_stats() const;

 private:
  PeerClientOptions options_;
  std::shared_ptr<ConnectionPool> pool_;  // null: options.pool.per_peer == 0
};

}  // namespace ptc::cluster
