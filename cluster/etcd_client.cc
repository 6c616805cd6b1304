// etcd's v3 API over its JSON gateway (cpp-httplib).
#include "cluster/etcd_client.h"

#include <httplib.h>

#include <thread>

#include "cluster/etcd_codec.h"
#include "cluster/peer_protocol.h"

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;

// The largest answer read (a range over many keys).
constexpr size_t kMaxAnswerBytes = 64 << 20;

std::string Quoted(std::string_view key) { return "'" + std::string(key) + "'"; }

}  // namespace

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return InvalidArgumentError("etcd: no endpoint");
  for (const std::string& e : options.endpoints) PTC_RETURN_IF_ERROR(ParsePeerAddress(e), "etcd endpoint");
  if (options.attempts < 1) return InvalidArgumentError("etcd: attempts < 1");
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

Result<std::string> EtcdClient::Post(const std::string& path, const std::string& body, bool idempotent,
                                     std::string_view what) const {
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  Status last;
  for (int attempt = 0; attempt < options_.attempts; ++attempt) {
    for (const std::string& endpoint : options_.endpoints) {
      const auto left = deadline - Clock::now();
      const std::string where = "etcd " + endpoint + ": " + std::string(what);
      if (left <= Clock::duration::zero()) return IOError(where + ": deadline passed (" + last.message() + ")");
      const PeerAddress a = *ParsePeerAddress(endpoint);
      httplib::Client cli(a.host, a.port);
      cli.set_keep_alive(false);
      cli.set_connection_timeout(left);
      cli.set_read_timeout(left);
      cli.set_write_timeout(left);
      httplib::Request req;
      req.method = "POST";
      req.path = path;
      req.body = body;
      req.headers = {{"Content-Type", "application/json"}};
      int status = 0;
      std::string answer;
      bool too_large = false;
      req.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        return true;
      };
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        too_large = answer.size() + n > kMaxAnswerBytes;
        if (too_large) return false;
        answer.append(data, n);
        return true;
      };
      httplib::Result res = cli.send(req);
      // The gateway ends an error answer with HTTP trailers, which cpp-httplib
      // 0.11 cannot read (Error::Read after the body): the body is whole by then.
      const bool error_answer = status != 0 && status != 200 && (res || res.error() == httplib::Error::Read);
      if (!res && !error_answer) {
        last = IOError(where + ": " + httplib::to_string(res.error()) + (too_large ? " (answer too large)" : ""));
        if (res.error() == httplib::Error::Connection || idempotent) continue;
        return last;
      }
      if (status == 200) return answer;
      Status s = DecodeErrorBody(where, answer);
      if (s.ok()) s = IOError(where + ": HTTP " + std::to_string(status) + ": " + answer.substr(0, 200));
      // Unavailable (no leader yet) is worth another try for a read.
      if (idempotent && s.code() == Code::kIOError) {
        last = s;
        continue;
      }
      return s;
    }
    const auto left = deadline - Clock::now();
    if (left > Clock::duration::zero()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(50 << attempt)));
    }
  }
  return last.WithContext(std::to_string(options_.attempts) + " attempts");
}

Status EtcdClient::Health() const {
  Status last;
  for (const std::string& endpoint : options_.endpoints) {
    const PeerAddress a = *ParsePeerAddress(endpoint);
    httplib::Client cli(a.host, a.port);
    cli.set_connection_timeout(options_.timeout);
    cli.set_read_timeout(options_.timeout);
    httplib::Result res = cli.Get("/health");
    if (!res) {
      last = IOError("etcd " + endpoint + ": health: " + httplib::to_string(res.error()));
    } else if (res->status != 200 || res->body.find("\"health\":\"true\"") == std::string::npos) {
      last = IOError("etcd " + endpoint + ": unhealthy: HTTP " + std::to_string(res->status) + " " +
                     res->body.substr(0, 200));
    } else {
      return Status::OK();
    }
  }
  return last;
}

Result<bool> EtcdClient::WaitForChange(std::string_view prefix, int64_t revision,
                                       std::chrono::milliseconds timeout) const {
  const std::string what = "watch " + Quoted(prefix);
  const std::string body = EncodeWatchCreateRequest(prefix, PrefixRangeEnd(prefix), revision + 1);
  Status last;
  for (const std::string& endpoint : options_.endpoints) {
    const std::string where = "etcd " + endpoint + ": " + what;
    const PeerAddress a = *ParsePeerAddress(endpoint);
    httplib::Client cli(a.host, a.port);
    cli.set_keep_alive(false);
    cli.set_connection_timeout(options_.timeout);
    cli.set_write_timeout(options_.timeout);
    cli.set_read_timeout(timeout);  // no message for this long: nothing changed
    httplib::Request req;
    req.method = "POST";
    req.path = "/v3/watch";
    req.body = body;
    req.headers = {{"Content-Type", "application/json"}};
    int status = 0;
    bool created = false, changed = false;
    Status bad;
    std::string pending;  // the stream: one JSON message per line
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      pending.append(data, n);
      if (status != 200) return pending.size() <= kMaxAnswerBytes;  // an error body: decoded whole below
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
        Result<WatchMessage> m = DecodeWatchMessage(where, std::string_view(pending).substr(0, nl));
        if (!m.ok()) {
          bad = m.status();
          return false;
        }
        created = created || m->created;
        // A compacted start revision cancels the watch: what changed is unknown, so read again.
        changed = m->events > 0 || m->canceled || m->compact_revision > 0;
        if (changed) return false;
      }
      if (pending.size() > kMaxAnswerBytes) {
        bad = CorruptionError(where + ": a message of the stream exceeds " + std::to_string(kMaxAnswerBytes) + " bytes");
        return false;
      }
      return true;
    };
    httplib::Result res = cli.send(req);
    if (changed) return true;
    if (!bad.ok()) return bad;
    if (status == 200 && created) return false;  // the read timed out on a live watch: nothing changed
    if (status != 0 && status != 200) {
      Status s = DecodeErrorBody(where, pending);
      return s.ok() ? IOError(where + ": HTTP " + std::to_string(status) + ": " + pending.substr(0, 200)) : s;
    }
    last = IOError(where + ": " + (res ? std::string("the stream ended") : httplib::to_string(res.error())));
  }
  return last;
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) const {
  const std::string what = "put " + Quoted(key);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/put", EncodePutRequest(key, value, lease), false, what));
  return DecodeRevision("etcd: " + what, body);
}

Result<std::optional<KeyValue>> EtcdClient::Get(std::string_view key) const {
  const std::string what = "get " + Quoted(key);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", EncodeRangeRequest(key, ""), true, what));
  PTC_ASSIGN_OR_RETURN(RangeResponse r, DecodeRangeResponse("etcd: " + what, body));
  if (r.kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(r.kvs.front()));
}

Result<RangeResponse> EtcdClient::GetPrefix(std::string_view prefix) const {
  const std::string what = "get prefix " + Quoted(prefix);
  PTC_ASSIGN_OR_RETURN(std::string body,
                       Post("/v3/kv/range", EncodeRangeRequest(prefix, PrefixRangeEnd(prefix)), true, what));
  return DecodeRangeResponse("etcd: " + what, body);
}

Result<int64_t> EtcdClient::Delete(std::string_view key) const {
  const std::string what = "delete " + Quoted(key);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/deleterange", EncodeDeleteRangeRequest(key, ""), true, what));
  return DecodeDeleteRangeResponse("etcd: " + what, body);
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) const {
  const std::string what = "delete prefix " + Quoted(prefix);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/deleterange",
                                              EncodeDeleteRangeRequest(prefix, PrefixRangeEnd(prefix)), true, what));
  return DecodeDeleteRangeResponse("etcd: " + what, body);
}

Result<Lease> EtcdClient::GrantLease(int64_t ttl_seconds) const {
  if (ttl_seconds < 1) return InvalidArgumentError("etcd: lease TTL " + std::to_string(ttl_seconds) + " < 1 s");
  const std::string what = "grant a lease of " + std::to_string(ttl_seconds) + " s";
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/grant", EncodeLeaseGrantRequest(ttl_seconds), false, what));
  return DecodeLeaseGrantResponse("etcd: " + what, body);
}

Result<int64_t> EtcdClient::KeepAliveOnce(int64_t lease) const {
  const std::string what = "keep lease " + std::to_string(lease) + " alive";
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/keepalive", EncodeLeaseIdRequest(lease), true, what));
  PTC_ASSIGN_OR_RETURN(int64_t ttl, DecodeLeaseKeepAliveResponse("etcd: " + what, body));
  if (ttl <= 0) return NotFoundError("etcd: " + what + ": the lease expired or was revoked");
  return ttl;
}

Result<int64_t> EtcdClient::LeaseTimeToLive(int64_t lease) const {
  const std::string what = "time to live of lease " + std::to_string(lease);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/timetolive", EncodeLeaseIdRequest(lease), true, what));
  // The answer has the grant's fields (ID, TTL): TTL -1 once the lease is gone.
  PTC_ASSIGN_OR_RETURN(Lease l, DecodeLeaseGrantResponse("etcd: " + what, body));
  return l.ttl;
}

Status EtcdClient::RevokeLease(int64_t lease) const {
  const std::string what = "revoke lease " + std::to_string(lease);
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/revoke", EncodeLeaseIdRequest(lease), false, what));
  return DecodeRevision("etcd: " + what, body).status();
}

Result<TxnResponse> EtcdClient::Txn(const TxnRequest& txn) const {
  const std::string what = "transaction" + (txn.success.empty() ? std::string() : " on " + Quoted(txn.success[0].key));
  PTC_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", EncodeTxnRequest(txn), false, what));
  return DecodeTxnResponse("etcd: " + what, body);
}

}  // namespace ptc::cluster
