// One HTTP/1.1 GET, for the data plane's client (peer_client.h): over a
// connection of its own, or one kept open between requests by a
// ConnectionPool (connection_pool.h). The response body is received in reads
// of up to 1 MiB, into the caller's buffer when it gives one. cpp-httplib's client, as Debian builds it,
// reads 4 KiB per recv with a poll before each: over a fast link that cost
// more CPU than the bytes (bench/cluster.py).
//
// Thread safety: HttpGet may be called concurrently (each call its own
// socket, a pool's connections handed to one call at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/connection_pool.h"
#include "cluster/peer_protocol.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

struct HttpGetRequest {
  PeerAddress peer;
  std::string target;  // "/path?query"
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::steady_clock::time_point deadline;
  // The longest wait for the peer to connect, take the request or send the
  // next bytes (0: the deadline only): a link cut mid-transfer, where no
  // reset ever comes, fails after this instead of at the deadline.
  std::chrono::milliseconds stall{0};
};

struct HttpHead {
  int status = 0;
  std::optional<uint64_t> content_length;  // nullopt: the body ends with the connection
  bool close = false;  // "Connection: close", or HTTP/1.0 without "Connection: keep-alive"
};

// What to do with a response's body, as on_head decides from its head.
struct HttpBody {
  bool read = true;  // false: stop here (the connection is closed)
  // Where to receive the body straight from the socket when it has a
  // Content-Length of at most `capacity` bytes (no copy); null: a buffer of
  // HttpGet's own. on_body then gets pointers into it.
  char* into = nullptr;
  uint64_t capacity = 0;
};

// Parses a response head: "HTTP/1.x CODE reason" and header lines, each
// ending "\r\n" but the last (the head without its final empty line).
// \error IOError naming `where` for a malformed status line or header, a
//        Content-Length that is not a decimal of at most 19 digits, or a
//        Transfer-Encoding other than identity.
Result<HttpHead> ParseHttpHead(std::string_view head, const std::string& where);

// Sends the request; calls on_head once the response's head is in, then
// on_body with the body's bytes in order. on_body returning false stops the
// transfer (the connection is closed) and HttpGet returns OK.
// With a pool: the request goes on a kept connection to the peer when the
// pool has one (else a new one), without "Connection: close"; the connection
// goes back to the pool when the response was read whole (a Content-Length,
// every byte of it taken by on_body) and the peer did not say it closes it.
// A kept connection the peer closed before answering (the end of the stream
// or a reset before the response's first byte) is tried once more on a
// fresh connection. Without a pool: "Connection: close", a connection per call.
// \error IOError naming the peer for what the transport does: no connection,
//        a send or receive failing, the deadline passing, nothing from the
//        peer for `stall`, a malformed or
//        chunked response head, a body shorter than its Content-Length.
Status HttpGet(const HttpGetRequest& request, const std::function<HttpBody(const HttpHead&)>& on_head,
               const std::function<bool(const char*, size_t)>& on_body, ConnectionPool* pool = nullptr);

}  // namespace ptc::cluster
