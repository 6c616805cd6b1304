// An in-memory S3 bucket behind the Transport interface (cluster/s3/
// transport.h), for unit tests of the client, the S3Env and the durable
// tier's rules without a server: PUT, GET (with Range), HEAD, DELETE, copy,
// ListObjectsV2 and multipart uploads, path-style, signatures not checked.
// Faults on demand: the next N requests matching a method (and a part of
// the target) answer `status` (0: no answer at all). The real server's
// tests run against radosgw (tests/ceph/ceph.sh).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <string>

#include "cluster/s3/transport.h"

namespace ptc::cluster::s3::testing {

class FakeS3 final : public Transport {
 public:
  static constexpr int kSinkStopped = -1;  // Answer's: the request's sink refused the body
  struct Fault {
    std::string method;  // "" any
    std::string target;  // a substring of the target; "" any
    int status = 503;    // 0: no answer (IOError)
    int times = 1;
  };
  void Inject(Fault f) {
    std::lock_guard lock(mu_);
    faults_.push_back(f);
  }
  void ClearFaults() {
    std::lock_guard lock(mu_);
    faults_.clear();
  }
  int requests() const { return requests_; }
  std::map<std::string, std::string> objects() const {
    std::lock_guard lock(mu_);
    return objects_;
  }
  void Set(const std::string& key, std::string bytes) {
    std::lock_guard lock(mu_);
    objects_[key] = std::move(bytes);
  }
  size_t open_uploads() const {
    std::lock_guard lock(mu_);
    return uploads_.size();
  }

  Result<HttpResponse> Send(const HttpRequest& r) override {
    ++requests_;
    std::lock_guard lock(mu_);
    for (Fault& f : faults_) {
      if (f.times > 0 && (f.method.empty() || f.method == r.method) && r.target.find(f.target) != std::string::npos) {
        --f.times;
        if (f.status == 0) return IOError("fake: no answer to " + r.method + " " + r.target);
        return HttpResponse{f.status, {}, "<Error><Code>" + std::string(f.status == 503 ? "SlowDown" : "InternalError") +
                                              "</Code><Message>injected</Message></Error>"};
      }
    }
    HttpResponse a = Answer(r);
    if (a.status == kSinkStopped) return IOError("fake: the body's sink stopped " + r.method + " " + r.target);
    return a;
  }

 private:
  static std::string Unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size()) {
        out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        out += s[i];
      }
    }
    return out;
  }
  std::string Header(const HttpRequest& r, const std::string& name) {
    for (const auto& [k, v] : r.headers) {
      std::string l = k;
      for (char& c : l) c = static_cast<char>(std::tolower(c));
      if (l == name) return v;
    }
    return "";
  }
  HttpResponse Answer(const HttpRequest& r) {
    const size_t q = r.target.find('?');
    std::string path = Unescape(r.target.substr(0, q));
    std::map<std::string, std::string> query;
    if (q != std::string::npos) {
      std::string_view rest = std::string_view(r.target).substr(q + 1);
      while (!rest.empty()) {
        const size_t amp = rest.find('&');
        std::string_view kv = rest.substr(0, amp);
        const size_t eq = kv.find('=');
        query[Unescape(kv.substr(0, eq))] = eq == std::string_view::npos ? "" : Unescape(kv.substr(eq + 1));
        rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      }
    }
    const size_t slash = path.find('/', 1);
    const std::string key = slash == std::string::npos ? "" : path.substr(slash + 1);
    const HttpResponse missing{404, {}, "<Error><Code>NoSuchKey</Code></Error>"};
    if (key.empty() && r.method == "GET") return List(query);
    if (r.method == "POST" && query.count("uploads")) {
      const std::string id = "up" + std::to_string(++next_upload_);
      uploads_[id] = {};
      return {200, {}, "<InitiateMultipartUploadResult><UploadId>" + id + "</UploadId></InitiateMultipartUploadResult>"};
    }
    if (r.method == "PUT" && query.count("partNumber")) {
      auto u = uploads_.find(query["uploadId"]);
      if (u == uploads_.end()) return {404, {}, "<Error><Code>NoSuchUpload</Code></Error>"};
      u->second[std::stoi(query["partNumber"])] = std::string(r.body);
      return {200, {{"etag", "\"e" + query["partNumber"] + "\""}}, ""};
    }
    if (r.method == "POST" && query.count("uploadId")) {
      auto u = uploads_.find(query["uploadId"]);
      if (u == uploads_.end()) return {404, {}, "<Error><Code>NoSuchUpload</Code></Error>"};
      std::string all;
      for (const auto& [n, bytes] : u->second) all += bytes;
      objects_[key] = all;
      uploads_.erase(u);
      return {200, {}, "<CompleteMultipartUploadResult/>"};
    }
    if (r.method == "DELETE" && query.count("uploadId")) {
      uploads_.erase(query["uploadId"]);
      return {204, {}, ""};
    }
    if (r.method == "PUT") {
      const std::string source = Header(r, "x-amz-copy-source");
      if (!source.empty()) {
        auto from = objects_.find(Unescape(source).substr(Unescape(source).find('/', 1) + 1));
        if (from == objects_.end()) return missing;
        objects_[key] = from->second;
        return {200, {}, "<CopyObjectResult/>"};
      }
      objects_[key] = std::string(r.body);
      return {200, {}, ""};
    }
    auto o = objects_.find(key);
    if (r.method == "DELETE") {
      if (o != objects_.end()) objects_.erase(o);
      return {204, {}, ""};
    }
    if (o == objects_.end()) return missing;
    if (r.method == "HEAD") return {200, {{"content-length", std::to_string(o->second.size())}}, ""};
    std::string bytes = o->second;
    if (const std::string range = Header(r, "range"); !range.empty()) {
      const uint64_t a = std::stoull(range.substr(6)), b = std::stoull(range.substr(range.find('-') + 1));
      bytes = a >= bytes.size() ? "" : bytes.substr(a, b - a + 1);
    }
    HttpResponse out{200, {}, ""};
    if (r.sink) {  // in pieces of 1 MiB, as the transport gives them
      if (bytes.size() > r.capacity) return {kSinkStopped, {}, ""};
      for (size_t at = 0; at < bytes.size(); at += 1 << 20) {
        const size_t n = std::min<size_t>(1 << 20, bytes.size() - at);
        if (!r.sink(at, bytes.data() + at, n)) return {kSinkStopped, {}, ""};
        out.received += n;
      }
    } else if (r.into != nullptr) {
      if (bytes.size() > r.capacity) return {200, {}, ""};
      std::copy(bytes.begin(), bytes.end(), r.into);
      out.received = bytes.size();
    } else {
      out.body = bytes;
    }
    return out;
  }
  HttpResponse List(std::map<std::string, std::string>& query) {
    const std::string prefix = query["prefix"], delimiter = query["delimiter"];
    std::string xml = "<ListBucketResult><Prefix>" + prefix + "</Prefix><IsTruncated>false</IsTruncated>";
    std::set<std::string> common;
    for (const auto& [k, v] : objects_) {
      if (!k.starts_with(prefix)) continue;
      const size_t d = delimiter.empty() ? std::string::npos : k.find(delimiter, prefix.size());
      if (d != std::string::npos) {
        common.insert(k.substr(0, d + 1));
      } else {
        xml += "<Contents><Key>" + k + "</Key></Contents>";
      }
    }
    for (const std::string& c : common) xml += "<CommonPrefixes><Prefix>" + c + "</Prefix></CommonPrefixes>";
    return {200, {}, xml + "</ListBucketResult>"};
  }

  mutable std::mutex mu_;
  std::map<std::string, std::string> objects_;
  std::map<std::string, std::map<int, std::string>> uploads_;
  std::vector<Fault> faults_;
  int next_upload_ = 0;
  std::atomic<int> requests_{0};
};

}  // namespace ptc::cluster::s3::testing
