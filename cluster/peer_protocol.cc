// The peer data plane's request format.
#include "cluster/peer_protocol.h"

#include <charconv>

#include "ptc/store/manifest.h"

namespace ptc::cluster {
namespace {

bool Unreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~' || c == '/';
}

std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    if (Unreserved(c)) {
      out += c;
    } else {
      const unsigned char u = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

Result<uint64_t> ParseDecimal(std::string_view name, std::string_view text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end) {
    return InvalidArgumentError("parameter '" + std::string(name) + "': not a decimal number below 2^64");
  }
  return v;
}

Result<std::string> One(const std::multimap<std::string, std::string>& params, const std::string& name) {
  const size_t n = params.count(name);
  if (n == 0) return InvalidArgumentError("parameter '" + name + "' is missing");
  if (n > 1) return InvalidArgumentError("parameter '" + name + "' is repeated");
  return params.find(name)->second;
}

}  // namespace

std::string PeerAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<PeerAddress> ParsePeerAddress(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgumentError("peer address '" + std::string(text) + "': expected HOST:PORT (port 1-65535)");
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad();
  std::string_view host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad();
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad();
  }
  const std::string_view port = text.substr(colon + 1);
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) return bad();
  return PeerAddress{std::string(host), p};
}

std::string ShardRequestTarget(const ShardRequest& r) {
  return std::string(kShardPath) + "?file=" + PercentEncode(r.file) + "&offset=" + std::to_string(r.offset) +
         "&length=" + std::to_string(r.length);
}

std::string PublishedTarget(std::string_view name) {
  return std::string(kPublishedPath) + "?name=" + PercentEncode(name);
}

Result<ShardRequest> ParseShardRequest(const std::multimap<std::string, std::string>& params) {
  for (const auto& [name, value] : params) {
    if (name != "file" && name != "offset" && name != "length") {
      return InvalidArgumentError("unknown parameter '" + name.substr(0, 64) + "'");
    }
  }
  ShardRequest r;
  PTC_ASSIGN_OR_RETURN(r.file, One(params, "file"));
  PTC_ASSIGN_OR_RETURN(std::string offset, One(params, "offset"));
  PTC_ASSIGN_OR_RETURN(std::string length, One(params, "length"));
  PTC_ASSIGN_OR_RETURN(r.offset, ParseDecimal("offset", offset));
  PTC_ASSIGN_OR_RETURN(r.length, ParseDecimal("length", length));
  if (r.length == 0) return InvalidArgumentError("parameter 'length' is 0");
  if (r.offset > UINT64_MAX - r.length) return InvalidArgumentError("offset + length overflows");
  if (!IsSafeRelativePath(r.file) || r.file.find('\0') != std::string::npos) {
    return InvalidArgumentError("parameter 'file': not a relative path within the store");
  }
  return r;
}

std::string BearerHeader(std::string_view token) { return "Bearer " + std::string(token); }

std::optional<std::string_view> ParseBearer(std::string_view header) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() <= kPrefix.size() || header.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  return header.substr(kPrefix.size());
}

}  // namespace ptc::cluster
