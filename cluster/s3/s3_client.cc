#include "cluster/s3/s3_client.h"

#include <ctime>
#include <random>
#include <thread>

#include "cluster/s3/sigv4.h"

namespace ptc::cluster::s3 {
namespace {

std::string AmzDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string Decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    static constexpr std::pair<std::string_view, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool known = false;
    for (const auto& [e, c] : kEntities) {
      if (s.substr(i).starts_with(e)) {
        out += c;
        i += e.size() - 1;
        known = true;
        break;
      }
    }
    if (!known) out += '&';
  }
  return out;
}

double Jitter() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

constexpr size_t kSignedBodyBytes = 1 << 20;

std::string Name(const std::string& bucket, const std::string& key) { return "s3://" + bucket + "/" + key; }

// The error for a final (or the last transient) answer.
Status AnswerError(const std::string& what, const HttpResponse& r) {
  const auto code = XmlValues(r.body, "Code");
  const auto message = XmlValues(r.body, "Message");
  std::string why = "HTTP " + std::to_string(r.status);
  if (!code.empty()) why += " " + code.front();
  if (!message.empty() && !message.front().empty()) why += ": " + message.front();
  if (r.status == 404) return NotFoundError(what + ": " + why);
  if (r.status == 403) return Status(Code::kPermissionDenied, what + ": " + why);
  return IOError(what + ": " + why);
}

}  // namespace

std::vector<std::string> XmlValues(std::string_view xml, std::string_view tag) {
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = xml.find(open, at)) != std::string_view::npos) {
    const size_t begin = at + open.size();
    const size_t end = xml.find(close, begin);
    if (end == std::string_view::npos) break;
    out.push_back(Decode(xml.substr(begin, end - begin)));
    at = end + close.size();
  }
  return out;
}

S3Client::S3Client(S3Config config, std::unique_ptr<Transport> transport, RetryPolicy policy)
    : config_(std::move(config)), transport_(std::move(transport)), policy_(policy) {}

Result<std::shared_ptr<S3Client>> S3Client::FromEnvironment() {
  PTC_ASSIGN_OR_RETURN(S3Config config, LoadS3Config());
  auto transport = NewHttpTransport(config.endpoint);
  return std::make_shared<S3Client>(std::move(config), std::move(transport));
}

HttpRequest S3Client::Sign(const Call& call) const {
  SignInput in;
  in.method = call.method;
  in.path = "/" + call.bucket + (call.key.empty() ? "" : "/" + call.key);
  in.query = call.query;
  // A large body (a part, a share) goes unsigned: hashing it costs a pass
  // over the bytes, and what matters is checked anyway: every piece read
  // back is checked against its record's checksums (durable.h). Small
  // bodies (manifests, records, the multipart list) are signed.
  in.payload_hash = call.body.size() >= kSignedBodyBytes ? "UNSIGNED-PAYLOAD" : Sha256Hex(call.body);
  in.amz_date = AmzDate();
  in.region = config_.region;
  in.service = "s3";
  const Endpoint& e = config_.endpoint;
  const bool default_port = (e.scheme == "http" && e.port == 80) || (e.scheme == "https" && e.port == 443);
  in.headers = call.headers;
  in.headers.emplace_back("host", default_port ? e.host : e.host + ":" + std::to_string(e.port));
  in.headers.emplace_back("x-amz-date", in.amz_date);
  in.headers.emplace_back("x-amz-content-sha256", in.payload_hash);
  if (!config_.credentials.session_token.empty()) {
    in.headers.emplace_back("x-amz-security-token", config_.credentials.session_token);
  }
  HttpRequest r;
  r.method = call.method;
  r.target = UriEncode(in.path, true);
  if (const std::string q = CanonicalQuery(call.query); !q.empty()) r.target += "?" + q;
  r.headers = in.headers;
  r.headers.emplace_back("Authorization", Authorization(in, config_.credentials));
  r.body = call.body;
  r.into = call.into;
  r.capacity = call.capacity;
  r.sink = call.sink;
  return r;
}

Result<HttpResponse> S3Client::Send(const Call& call) const {
  const std::string what = call.method + " " + Name(call.bucket, call.key);
  Status last;
  for (int attempt = 1;; ++attempt) {
    Result<HttpResponse> r = transport_->Send(Sign(call));  // signed again: the date moves on
    if (r.ok() && r->status / 100 == 2) return r;
    const int status = r.ok() ? r->status : 0;
    last = r.ok() ? AnswerError(what, *r) : r.status();
    if (!Transient(status) || attempt >= policy_.attempts) {
      return attempt > 1 ? last.WithContext(std::to_string(attempt) + " tries") : last;
    }
    std::this_thread::sleep_for(Backoff(policy_, attempt, Jitter()));
  }
}

Status S3Client::Put(const std::string& bucket, const std::string& key, std::string_view body) const {
  return Send({"PUT", bucket, key, {}, {}, body}).status();
}

Status S3Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n,
                          char* dst) const {
  if (n == 0) return Status::OK();
  Call c{"GET", bucket, key, {}, {{"range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1)}}};
  c.into = dst;
  c.capacity = n;
  PTC_ASSIGN_OR_RETURN(HttpResponse r, Send(c));
  if (r.received != n) {
    return CorruptionError(Name(bucket, key) + ": bytes " + std::to_string(offset) + "+" + std::to_string(n) +
                           " asked, " + std::to_string(r.received) + " came (the object is shorter)");
  }
  return Status::OK();
}

Status S3Client::GetRangeTo(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n,
                            const std::function<Status(uint64_t, const char*, size_t)>& sink) const {
  if (n == 0) return Status::OK();
  Call c{"GET", bucket, key, {}, {{"range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1)}}};
  Status failed;  // the sink's: no retry
  c.capacity = n;
  c.sink = [&](uint64_t at, const char* data, size_t k) {
    if (failed.ok()) failed = sink(at, data, k);
    return failed.ok();
  };
  Result<HttpResponse> r = Send(c);
  PTC_RETURN_IF_ERROR(failed);
  PTC_RETURN_IF_ERROR(r.status());
  if (r->received != n) {
    return CorruptionError(Name(bucket, key) + ": bytes " + std::to_string(offset) + "+" + std::to_string(n) +
                           " asked, " + std::to_string(r->received) + " came (the object is shorter)");
  }
  return Status::OK();
}

Result<std::string> S3Client::Get(const std::string& bucket, const std::string& key) const {
  PTC_ASSIGN_OR_RETURN(HttpResponse r, Send({"GET", bucket, key}));
  return std::move(r.body);
}

Result<std::optional<uint64_t>> S3Client::Head(const std::string& bucket, const std::string& key) const {
  Result<HttpResponse> r = Send({"HEAD", bucket, key});
  if (!r.ok() && r.status().code() == Code::kNotFound) return std::optional<uint64_t>();
  PTC_RETURN_IF_ERROR(r.status());
  auto length = r->headers.find("content-length");
  if (length == r->headers.end()) return IOError("HEAD " + Name(bucket, key) + ": no Content-Length");
  return std::optional<uint64_t>(std::stoull(length->second));
}

Result<S3Client::Listing> S3Client::List(const std::string& bucket, const std::string& prefix,
                                         const std::string& delimiter) const {
  Listing out;
  std::string token;
  for (;;) {
    Call c{"GET", bucket, "", {{"list-type", "2"}, {"prefix", prefix}}};
    if (!delimiter.empty()) c.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) c.query.emplace_back("continuation-token", token);
    PTC_ASSIGN_OR_RETURN(HttpResponse r, Send(c), "listing " + Name(bucket, prefix));
    for (const std::string& contents : XmlValues(r.body, "Contents")) {
      for (std::string& k : XmlValues(contents, "Key")) out.keys.push_back(std::move(k));
    }
    for (const std::string& common : XmlValues(r.body, "CommonPrefixes")) {
      for (std::string& p : XmlValues(common, "Prefix")) out.prefixes.push_back(std::move(p));
    }
    const auto truncated = XmlValues(r.body, "IsTruncated");
    const auto next = XmlValues(r.body, "NextContinuationToken");
    if (truncated.empty() || truncated.front() != "true" || next.empty()) return out;
    token = next.front();
  }
}

Status S3Client::Delete(const std::string& bucket, const std::string& key) const {
  Status s = Send({"DELETE", bucket, key}).status();
  return s.code() == Code::kNotFound ? Status::OK() : s;
}

Status S3Client::Copy(const std::string& bucket, const std::string& from, const std::string& to) const {
  return Send({"PUT", bucket, to, {}, {{"x-amz-copy-source", UriEncode("/" + bucket + "/" + from, true)}}}).status();
}

Result<std::string> S3Client::CreateMultipart(const std::string& bucket, const std::string& key) const {
  PTC_ASSIGN_OR_RETURN(HttpResponse r, Send({"POST", bucket, key, {{"uploads", ""}}}));
  auto id = XmlValues(r.body, "UploadId");
  if (id.empty() || id.front().empty()) return IOError("POST " + Name(bucket, key) + "?uploads: no UploadId in the answer");
  return id.front();
}

Result<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key, const std::string& upload,
                                         int number, std::string_view body) const {
  PTC_ASSIGN_OR_RETURN(HttpResponse r,
                       Send({"PUT", bucket, key, {{"partNumber", std::to_string(number)}, {"uploadId", upload}}, {}, body}));
  auto etag = r.headers.find("etag");
  if (etag == r.headers.end()) return IOError("PUT " + Name(bucket, key) + " part " + std::to_string(number) + ": no ETag");
  return etag->second;
}

Status S3Client::CompleteMultipart(const std::string& bucket, const std::string& key, const std::string& upload,
                                   const std::vector<std::string>& etags) const {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] + "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  PTC_ASSIGN_OR_RETURN(HttpResponse r, Send({"POST", bucket, key, {{"uploadId", upload}}, {}, xml}));
  // S3 may answer 200 with an error in the body once the parts are assembled.
  if (!XmlValues(r.body, "Error").empty() || r.body.find("<Error>") != std::string::npos) {
    return AnswerError("POST " + Name(bucket, key) + "?uploadId", {500, {}, r.body});
  }
  return Status::OK();
}

Status S3Client::AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload) const {
  Status s = Send({"DELETE", bucket, key, {{"uploadId", upload}}}).status();
  return s.code() == Code::kNotFound ? Status::OK() : s;
}

}  // namespace ptc::cluster::s3
