// AWS Signature Version 4 (docs.aws.amazon.com, "Signature Version 4 signing
// process"), as S3 takes it in the Authorization header: a pure function of
// the request, the credentials and the time, so that AWS's published test
// vectors check it (tests/s3_sigv4_test.cc). OpenSSL's SHA-256 and HMAC.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ptc::cluster::s3 {

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty: none (else sent as x-amz-security-token)
};

struct SignInput {
  std::string method;          // "GET"
  std::string path;            // "/bucket/key", not yet encoded
  std::vector<std::pair<std::string, std::string>> query;  // not yet encoded; a flag has an empty value
  // Every header to sign, names in any case (host and x-amz-date among them).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;    // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
  std::string amz_date;        // "20150830T123600Z"
  std::string region;          // "us-east-1"
  std::string service;         // "s3"
};

// Hex SHA-256 of `bytes`.
std::string Sha256Hex(std::string_view bytes);
// `text` percent-encoded as SigV4 wants (RFC 3986 unreserved kept; '/' kept
// when `keep_slash`).
std::string UriEncode(std::string_view text, bool keep_slash);
// "a=1&b=" with names and values encoded, sorted by name then value.
std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query);
// The canonical request (its lines joined by '\n').
std::string CanonicalRequest(const SignInput& in);
// "AWS4-HMAC-SHA256\nDATE\nSCOPE\nHASH".
std::string StringToSign(const SignInput& in);
// The Authorization header's value.
std::string Authorization(const SignInput& in, const Credentials& credentials);

}  // namespace ptc::cluster::s3
