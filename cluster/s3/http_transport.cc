// cpp-httplib under the S3 client: already the cluster layer's HTTP library,
// built by Debian with OpenSSL (HTTPS), with timeouts per connect and per
// read/write and keep-alive. A small pool of clients, one per request in
// flight, so parallel uploads and ranged reads each reuse a connection.
#include <httplib.h>

#include <algorithm>
#include <cctype>

#include "cluster/http_get.h"
#include "cluster/s3/transport.h"
#include "ptc/base/mutex.h"

namespace ptc::cluster::s3 {
namespace {

class HttpTransport final : public Transport {
 public:
  HttpTransport(Endpoint endpoint, TransportOptions options) : endpoint_(std::move(endpoint)), options_(options) {}

  Result<HttpResponse> Send(const HttpRequest& request) override {
    // A ranged read over plain HTTP: straight into the caller's buffer in
    // reads of up to 1 MiB (http_get.h; cpp-httplib reads 4 KiB at a time).
    // (HttpGet names the host as HOST:PORT, as the signature does for a port
    // other than 80.)
    if (request.method == "GET" && (request.into != nullptr || request.sink) && endpoint_.scheme == "http" &&
        endpoint_.port != 80) {
      return Get(request);
    }
    std::unique_ptr<httplib::Client> cli = Take();
    HttpResponse out;
    bool too_long = false;
    httplib::Request req;
    req.method = request.method;
    req.path = request.target;
    for (const auto& [k, v] : request.headers) req.headers.emplace(k, v);
    if (request.body.size() >= kStreamBodyBytes) {
      // Sent from the caller's bytes (a part): no copy held beside them.
      req.content_length_ = request.body.size();
      req.content_provider_ = [body = request.body](size_t offset, size_t length, httplib::DataSink& sink) {
        return sink.write(body.data() + offset, std::min(length, body.size() - offset));
      };
    } else if (!request.body.empty() || request.method == "PUT" || request.method == "POST") {
      req.body.assign(request.body.data(), request.body.size());
    }
    // Called before a body only (not for HEAD or an empty answer): the
    // status and headers are taken from the result below.
    req.response_handler = [&](const httplib::Response& r) {
      out.status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (request.sink && out.status / 100 == 2) {
        too_long = out.received + n > request.capacity;
        if (too_long || !request.sink(out.received, data, n)) return false;
        out.received += n;
        return true;
      }
      if (request.into != nullptr && out.status / 100 == 2) {
        too_long = out.received + n > request.capacity;
        if (too_long) return false;
        std::copy(data, data + n, request.into + out.received);
        out.received += n;
        return true;
      }
      too_long = out.body.size() + n > kMaxBodyBytes;
      if (too_long) return false;
      out.body.append(data, n);
      return true;
    };
    httplib::Result res = cli->send(req);
    if (!res) {
      return IOError("S3 " + endpoint_.ToString() + ": " + request.method + " " + request.target + ": " +
                     (too_long ? std::string("the answer is longer than asked for") : httplib::to_string(res.error())));
    }
    out.status = res->status;
    for (const auto& [k, v] : res->headers) {
      std::string name = k;
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      out.headers[name] = v;
    }
    Give(std::move(cli));
    return out;
  }

 private:
  Result<HttpResponse> Get(const HttpRequest& request) {
    HttpGetRequest get;
    get.peer = {endpoint_.host, endpoint_.port};
    get.target = request.target;
    for (const auto& [k, v] : request.headers) {
      if (k != "host") get.headers.emplace_back(k, v);  // HttpGet sends its own
    }
    get.deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    get.stall = options_.io_timeout;
    HttpResponse out;
    bool too_long = false;
    Status s = HttpGet(
        get,
        [&](const HttpHead& head) {
          out.status = head.status;
          const bool ok = head.status / 100 == 2;
          return HttpBody{true, ok ? request.into : nullptr, ok ? request.capacity : 0};
        },
        [&](const char* data, size_t n) {
          if (out.status / 100 != 2) {
            too_long = out.body.size() + n > kMaxBodyBytes;
            if (!too_long) out.body.append(data, n);
            return !too_long;
          }
          too_long = out.received + n > request.capacity;
          if (too_long) return false;
          if (request.sink) {
            if (!request.sink(out.received, data, n)) return false;
          } else if (data != request.into + out.received) {
            std::copy(data, data + n, request.into + out.received);
          }
          out.received += n;
          return true;
        });
    if (!s.ok() || too_long) {
      return IOError("S3 " + endpoint_.ToString() + ": GET " + request.target + ": " +
                     (too_long ? std::string("the answer is longer than asked for") : s.message()));
    }
    return out;
  }

  std::unique_ptr<httplib::Client> Take() {
    {
      MutexLock lock(&mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    auto c = std::make_unique<httplib::Client>(endpoint_.ToString());
    c->set_keep_alive(true);
    c->set_connection_timeout(options_.connect_timeout);
    c->set_read_timeout(options_.io_timeout);
    c->set_write_timeout(options_.io_timeout);
    return c;
  }
  void Give(std::unique_ptr<httplib::Client> c) {
    MutexLock lock(&mu_);
    if (idle_.size() < kIdleClients) idle_.push_back(std::move(c));
  }

  static constexpr size_t kIdleClients = 16;
  static constexpr size_t kStreamBodyBytes = 1 << 20;
  const Endpoint endpoint_;
  const TransportOptions options_;
  Mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> idle_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewHttpTransport(const Endpoint& endpoint, TransportOptions options) {
  return std::make_unique<HttpTransport>(endpoint, options);
}

}  // namespace ptc::cluster::s3
