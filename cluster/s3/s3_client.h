// The S3 calls the durable tier makes (path-style, SigV4-signed, over a
// Transport): objects put whole or in multipart uploads, read by byte
// range, listed, copied and deleted. Each call is retried on a transient
// failure (retry.h: no answer, 500/502/503/504, SlowDown among them) with
// backoff; every other answer is final. No body is buffered beyond what the
// caller hands over or asks for (a listing or an error answer: at most
// kMaxBodyBytes). Credentials go only into the signature: no message and
// no log line carries them.
//
// Every \error names the object as s3://BUCKET/KEY: NotFound for 404
// (NoSuchKey, NoSuchBucket, NoSuchUpload), PermissionDenied for 403, IOError
// for any other failure, with S3's error code and message when it sent one,
// after the last try.
//
// Thread safety: every method may be called from many threads at once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/s3/retry.h"
#include "cluster/s3/s3_config.h"
#include "cluster/s3/transport.h"
#include "ptc/base/status.h"

namespace ptc::cluster::s3 {

class S3Client {
 public:
  S3Client(S3Config config, std::unique_ptr<Transport> transport, RetryPolicy policy = {});

  // LoadS3Config and an HTTP transport.
  // \error as LoadS3Config.
  static Result<std::shared_ptr<S3Client>> FromEnvironment();

  Status Put(const std::string& bucket, const std::string& key, std::string_view body) const;
  // Bytes [offset, offset + n) of the object into dst (a ranged GET).
  // \error Corruption when the object is shorter.
  Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n, char* dst) const;
  // The same given to `sink` as the bytes arrive, in pieces of at most 1 MiB
  // (`at`: their offset from `offset`), through no buffer of the caller's; a
  // request tried again gives them again from the start. `sink`'s error ends
  // the read.
  // \error Corruption when the object is shorter; `sink`'s error.
  Status GetRangeTo(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n,
                    const std::function<Status(uint64_t at, const char* data, size_t n)>& sink) const;
  // A whole object of at most kMaxBodyBytes.
  Result<std::string> Get(const std::string& bucket, const std::string& key) const;
  // The object's size; nullopt when there is none.
  Result<std::optional<uint64_t>> Head(const std::string& bucket, const std::string& key) const;

  struct Listing {
    std::vector<std::string> keys;      // whole keys
    std::vector<std::string> prefixes;  // common prefixes (with the delimiter), when a delimiter is given
  };
  // Every key under `prefix` (all pages); `delimiter` "" for none.
  Result<Listing> List(const std::string& bucket, const std::string& prefix, const std::string& delimiter) const;
  Status Delete(const std::string& bucket, const std::string& key) const;  // OK when absent
  Status Copy(const std::string& bucket, const std::string& from, const std::string& to) const;

  Result<std::string> CreateMultipart(const std::string& bucket, const std::string& key) const;  // the upload id
  // Part `number` (from 1); its ETag.
  Result<std::string> UploadPart(const std::string& bucket, const std::string& key, const std::string& upload,
                                 int number, std::string_view body) const;
  Status CompleteMultipart(const std::string& bucket, const std::string& key, const std::string& upload,
                           const std::vector<std::string>& etags) const;
  Status AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload) const;

  const S3Config& config() const { return config_; }

 private:
  struct Call {
    std::string method;
    std::string bucket, key;
    std::vector<std::pair<std::string, std::string>> query{};
    std::vector<std::pair<std::string, std::string>> headers{};
    std::string_view body{};
    char* into = nullptr;
    uint64_t capacity = 0;
    std::function<bool(uint64_t, const char*, size_t)> sink{};
  };
  // Signs and sends `call`, retrying transient failures; a 2xx answer, or
  // the error for the last.
  Result<HttpResponse> Send(const Call& call) const;
  HttpRequest Sign(const Call& call) const;

  const S3Config config_;
  const std::unique_ptr<Transport> transport_;
  const RetryPolicy policy_;
};

// The text of each <tag>...</tag> in `xml` (entities decoded), in order.
std::vector<std::string> XmlValues(std::string_view xml, std::string_view tag);

}  // namespace ptc::cluster::s3
