// One HTTP exchange with an S3 endpoint, behind an interface so that the
// client's retries are tested against a transport that fails on demand
// (tests/s3_client_test.cc). The request is already signed.
//
// Thread safety: Send may be called from many threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/s3/s3_config.h"
#include "ptc/base/status.h"

namespace ptc::cluster::s3 {

struct HttpRequest {
  std::string method;
  std::string target;  // encoded path and query: "/bucket/key?uploads="
  std::vector<std::pair<std::string, std::string>> headers;
  std::string_view body;  // the caller's bytes, alive for the call
  // A successful (2xx) answer's body goes here when set (at most
  // `capacity` bytes: more is an error); else into HttpResponse::body.
  char* into = nullptr;
  uint64_t capacity = 0;
  // Else, when set, a successful answer's body is given to `sink` as it
  // arrives, in pieces of at most 1 MiB (`at`: their offset in the body;
  // at most `capacity` bytes), nothing held beside it; false stops the
  // transfer (an error).
  std::function<bool(uint64_t at, const char* data, size_t n)> sink;
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;       // at most kMaxBodyBytes when not received `into`
  uint64_t received = 0;  // bytes received `into`
};

// The most a body received into a string may hold (a listing, an error).
inline constexpr uint64_t kMaxBodyBytes = 16 << 20;

class Transport {
 public:
  virtual ~Transport() = default;
  // \error IOError naming the endpoint when no answer came (no connection,
  //        the timeout passed, the body cut short or too long).
  virtual Result<HttpResponse> Send(const HttpRequest& request) = 0;
};

struct TransportOptions {
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds io_timeout{30000};  // no byte sent or received for this long
};

// HTTP/1.1 (HTTPS with OpenSSL) over cpp-httplib, keeping connections open
// between requests.
std::unique_ptr<Transport> NewHttpTransport(const Endpoint& endpoint, TransportOptions options = {});

}  // namespace ptc::cluster::s3
