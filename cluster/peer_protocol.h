// The wire protocol of the peer data plane (docs/cluster.md): a worker's
// PeerServer serves byte ranges of the shard files its store's manifests
// name, to the other workers' PeerClients.
//
//   GET /v1/shard?file=REL&offset=O&length=N
//   Authorization: Bearer TOKEN
//
// REL is a shard record's `file` (relative to the store root,
// percent-encoded), O a byte offset in that file and N > 0 bytes; the range
// must lie inside the data of one shard record of the manifest that names
// REL. The answer is 200 with exactly N bytes (application/octet-stream), or
// an error status with a one-line text/plain reason:
//
//   400 malformed request     401 no or malformed Authorization   403 wrong token
//   404 a file that no served manifest names (nothing is opened), or one absent
//   413 N above the server's limit   416 range outside the shard's data
//   500 the file cannot be read
//
//   GET /v1/manifest?generation=G
//   Authorization: Bearer TOKEN
//
// The manifest of generation G (manifest.json's JSON) when it is the
// worker's current or a kept one: how a worker that was away brings its
// store up to the job's committed generation. 404 for another generation.
//
//   GET /v1/published?name=NAME
//   Authorization: Bearer TOKEN
//
// Bytes the worker publishes to the job's others while a change needs them (a
// DCP save's .metadata, from its proposal until the change ends:
// PeerServer::Publish), NAME percent-encoded. 404 when nothing of that name is
// published.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc::cluster {

inline constexpr char kShardPath[] = "/v1/shard";
inline constexpr char kManifestPath[] = "/v1/manifest";
inline constexpr char kPublishedPath[] = "/v1/published";
// The largest N a server accepts by default, and a client asks for at once.
inline constexpr uint64_t kDefaultMaxRequestBytes = 64 << 20;

// Where a worker's PeerServer listens.
struct PeerAddress {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  // "host:port" ("[v6]:port").
  std::string ToString() const;
  friend bool operator==(const PeerAddress&, const PeerAddress&) = default;
};

// Inverse of PeerAddress::ToString.
// \error InvalidArgument naming the text when it is not HOST:PORT with a port in 1-65535.
Result<PeerAddress> ParsePeerAddress(std::string_view text);

struct ShardRequest {
  std::string file;     // relative to the store root
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  friend bool operator==(const ShardRequest&, const ShardRequest&) = default;
};

// The request target: kShardPath and the query, `file` percent-encoded.
std::string ShardRequestTarget(const ShardRequest& r);

// The request target of the bytes published as `name`: kPublishedPath and the query.
std::string PublishedTarget(std::string_view name);

// The request of decoded query parameters (as the HTTP server parses them).
// \error InvalidArgument naming the parameter when `file`, `offset` or
//        `length` is missing or repeated, a number is not decimal or overflows,
//        length is 0, offset + length overflows, or the file is not a safe
//        relative path (manifest.h IsSafeRelativePath: no "..", no leading '/').
Result<ShardRequest> ParseShardRequest(const std::multimap<std::string, std::string>& params);

// "Bearer TOKEN".
std::string BearerHeader(std::string_view token);
// The token of an Authorization header's value "Bearer TOKEN"; nullopt for any other form.
std::optional<std::string_view> ParseBearer(std::string_view header);

}  // namespace ptc::cluster
