#include "cluster/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>

#include "ptc/base/hex.h"

namespace ptc::cluster::s3 {
namespace {

std::string Hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A header value as SigV4 canonicalizes it: trimmed, inner runs of spaces as one.
std::string Trimmed(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// Sorted (lower-case name, canonical value) pairs.
std::vector<std::pair<std::string, std::string>> SortedHeaders(const SignInput& in) {
  std::vector<std::pair<std::string, std::string>> h;
  for (const auto& [name, value] : in.headers) h.emplace_back(Lower(name), Trimmed(value));
  std::sort(h.begin(), h.end());
  return h;
}

std::string SignedHeaders(const SignInput& in) {
  std::string out;
  for (const auto& [name, value] : SortedHeaders(in)) out += (out.empty() ? "" : ";") + name;
  return out;
}

std::string Scope(const SignInput& in) {
  return in.amz_date.substr(0, 8) + "/" + in.region + "/" + in.service + "/aws4_request";
}

}  // namespace

std::string Sha256Hex(std::string_view bytes) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), out);
  return Hex(std::string_view(reinterpret_cast<const char*>(out), sizeof out));
}

std::string UriEncode(std::string_view text, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : query) q.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(q.begin(), q.end());
  std::string out;
  for (const auto& [k, v] : q) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

std::string CanonicalRequest(const SignInput& in) {
  std::string headers;
  for (const auto& [name, value] : SortedHeaders(in)) headers += name + ":" + value + "\n";
  return in.method + "\n" + UriEncode(in.path.empty() ? "/" : in.path, true) + "\n" + CanonicalQuery(in.query) +
         "\n" + headers + "\n" + SignedHeaders(in) + "\n" + in.payload_hash;
}

std::string StringToSign(const SignInput& in) {
  return "AWS4-HMAC-SHA256\n" + in.amz_date + "\n" + Scope(in) + "\n" + Sha256Hex(CanonicalRequest(in));
}

std::string Authorization(const SignInput& in, const Credentials& credentials) {
  std::string key = Hmac("AWS4" + credentials.secret_key, in.amz_date.substr(0, 8));
  key = Hmac(key, in.region);
  key = Hmac(key, in.service);
  key = Hmac(key, "aws4_request");
  const std::string signature = Hex(Hmac(key, StringToSign(in)));
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + Scope(in) +
         ", SignedHeaders=" + SignedHeaders(in) + ", Signature=" + signature;
}

}  // namespace ptc::cluster::s3
