// The peer data plane's client, verifying blocks on arrival.
#include "cluster/peer_client.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "cluster/http_get.h"
#include "ptc/base/checksum.h"

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;

// As shard_verify.cc names a shard.
std::string ShardLabel(const ShardRecord& s) {
  std::string out = "tensor '";
  out += s.tensor;
  out += "' boxes";
  for (const Box& b : s.boxes) {
    out += ' ';
    out += b.ToString();
  }
  out += " in ";
  out += s.file;
  return out;
}

// A one-line excerpt of an error body.
std::string Excerpt(std::string body) {
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
  std::replace(body.begin(), body.end(), '\n', ' ');
  return body.empty() ? "(no reason given)" : body;
}

Status StatusOfHttp(int status, const std::string& where, const std::string& body) {
  const std::string message = where + ": HTTP " + std::to_string(status) + ": " + Excerpt(body);
  switch (status) {
    case 401:
    case 403:
      return Status(Code::kPermissionDenied, message);
    case 404:
      return NotFoundError(message);
    case 400:
    case 413:
    case 416:
      return InvalidArgumentError(message);
    default:
      return IOError(message);
  }
}

struct Outcome {
  Status status;
  bool retry = false;  // a transport failure: the same request may be sent again
};

// One request: shard bytes [begin, end) (whole checksum blocks), each block
// checked as its last byte arrives; the part within [want, want + n) is
// copied to dst.
class BlockFetch {
 public:
  BlockFetch(const PeerClientOptions& o, ConnectionPool* pool, const PeerAddress& peer, const ShardRecord& shard,
             uint64_t begin, uint64_t end, std::string where)
      : o_(o),
        pool_(pool),
        peer_(peer),
        shard_(shard),
        begin_(begin),
        end_(end),
        where_(std::move(where)),
        hasher_(begin, shard.nbytes) {}

  Outcome Run(uint64_t want, uint64_t n, char* dst, Clock::time_point deadline) {
    if (deadline <= Clock::now()) return {IOError(where_ + ": deadline passed"), false};
    const ShardRequest request{shard_.file, shard_.offset + begin_, end_ - begin_};
    HttpGetRequest get{peer_, ShardRequestTarget(request), {{"Authorization", BearerHeader(o_.token)}}, deadline,
                       o_.stall};
    int status = 0;
    std::string error_body;
    auto on_head = [&](const HttpHead& head) {
      status = head.status;
      HttpBody body;
      // Asked for exactly what is fetched: received in place, hashed there.
      if (status == 200 && want == begin_ && n == end_ - begin_) {
        body.into = dst;
        body.capacity = n;
      }
      return body;
    };
    auto on_body = [&](const char* data, size_t len) {
      if (status != 200) {
        error_body.append(data, std::min<size_t>(len, 512 - std::min<size_t>(512, error_body.size())));
        return true;
      }
      return Consume(data, len, want, n, dst);
    };
    Status transport = HttpGet(get, on_head, on_body, pool_);
    if (!verify_.ok()) return {verify_, verify_.code() != Code::kCorruption};
    if (!transport.ok()) return {transport.WithContext(where_), true};
    if (status != 200) return {StatusOfHttp(status, where_, error_body), false};
    if (got_ != end_ - begin_) {
      return {
          IOError(where_ + ": " + std::to_string(got_) + " of " + std::to_string(end_ - begin_) + " bytes received"),
          true};
    }
    return {Status::OK(), false};
  }

 private:
  bool Consume(const char* data, size_t len, uint64_t want, uint64_t n, char* dst) {
    if (len > end_ - begin_ - got_) {
      verify_ = IOError(where_ + ": the peer sent more bytes than asked");
      return false;
    }
    const uint64_t pos = begin_ + got_;  // shard offset of data[0]
    const uint64_t lo = std::max(pos, want), hi = std::min(pos + len, want + n);
    if (lo < hi && dst + (lo - want) != data + (lo - pos)) {  // not received in place
      std::memcpy(dst + (lo - want), data + (lo - pos), static_cast<size_t>(hi - lo));
    }
    verify_ = hasher_.Update(data, len, [this](size_t block, uint64_t digest) { return CheckBlock(block, digest); });
    got_ += len;
    return verify_.ok();
  }

  Status CheckBlock(size_t block, uint64_t got) const {
    const uint64_t want = BlockChecksum(shard_, block);
    if (got == want) return Status::OK();
    return CorruptionError(where_ + ": checksum of block " + std::to_string(block) + " (bytes " +
                           std::to_string(BlockBegin(shard_, block)) + "-" + std::to_string(BlockEnd(shard_, block)) +
                           ") as received " + ChecksumToString(got) + " != " + ChecksumToString(want) +
                           " in the manifest");
  }

  const PeerClientOptions& o_;
  ConnectionPool* const pool_;
  const PeerAddress& peer_;
  const ShardRecord& shard_;
  const uint64_t begin_, end_;
  const std::string where_;
  BlockHasher hasher_;
  uint64_t got_ = 0;
  Status verify_;
};

}  // namespace

PeerClient::PeerClient(PeerClientOptions options)
    : options_(std::move(options)),
      pool_(options_.pool.per_peer > 0 ? std::make_shared<ConnectionPool>(options_.pool) : nullptr) {}

ConnectionPoolStats PeerClient::pool_stats() const { return pool_ ? pool_->stats() : ConnectionPoolStats{}; }

Status PeerClient::ReadShardRange(const PeerAddress& peer, const ShardRecord& shard, uint64_t offset_in_shard,
                                  uint64_t length, void* dst) const {
  const std::string who = "peer " + peer.ToString() + ": " + ShardLabel(shard);
  if (options_.max_request_bytes == 0 || options_.max_request_bytes % kChecksumBlockBytes != 0 ||
      options_.attempts < 1) {
    return InvalidArgumentError(who + ": max_request_bytes must be a positive multiple of " +
                                std::to_string(kChecksumBlockBytes) + " and attempts at least 1");
  }
  if (offset_in_shard > shard.nbytes || length > shard.nbytes - offset_in_shard) {
    return InvalidArgumentError(who + ": read of " + std::to_string(length) + " bytes at " +
                                std::to_string(offset_in_shard) + " leaves the shard of " +
                                std::to_string(shard.nbytes) + " bytes");
  }
  if (length == 0) return Status::OK();
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  const uint64_t begin = BlockBegin(shard, BlockOf(shard, offset_in_shard));
  const uint64_t end = BlockEnd(shard, BlockOf(shard, offset_in_shard + length - 1));
  char* out = static_cast<char*>(dst);
  for (uint64_t chunk = begin; chunk < end;) {
    const uint64_t chunk_end = std::min(end, chunk + options_.max_request_bytes);
    const std::string where = who + " bytes " + std::to_string(chunk) + "-" + std::to_string(chunk_end);
    for (int attempt = 1;; ++attempt) {
      Outcome o = BlockFetch(options_, pool_.get(), peer, shard, chunk, chunk_end, where)
                      .Run(offset_in_shard, length, out, deadline);
      if (o.status.ok()) break;
      const auto left = deadline - Clock::now();
      if (!o.retry || attempt >= options_.attempts || left <= Clock::duration::zero()) {
        return attempt > 1 ? o.status.WithContext("attempt " + std::to_string(attempt) + " of " +
                                                  std::to_string(options_.attempts))
                           : o.status;
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(50 * attempt)));
    }
    chunk = chunk_end;
  }
  return Status::OK();
}

Result<GenerationManifest> PeerClient::FetchManifest(const PeerAddress& peer, uint64_t generation) const {
  const std::string where = "worker " + peer.ToString() + ": manifest of generation " + std::to_string(generation);
  // A manifest names every piece of a model: generous, but bounded.
  constexpr size_t kMaxManifestBytes = 1ull << 30;
  HttpGetRequest get{peer,
                     std::string(kManifestPath) + "?generation=" + std::to_string(generation),
                     {{"Authorization", BearerHeader(options_.token)}},
                     Clock::now() + options_.timeout,
                     options_.stall};
  int status = 0;
  std::string body;
  bool too_large = false;
  auto on_head = [&](const HttpHead& head) {
    status = head.status;
    return HttpBody{};
  };
  auto on_body = [&](const char* data, size_t len) {
    too_large = body.size() + len > kMaxManifestBytes;
    if (too_large) return false;
    body.append(data, len);
    return true;
  };
  PTC_RETURN_IF_ERROR(HttpGet(get, on_head, on_body, pool_.get()), where);
  if (too_large) return IOError(where + ": larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  if (status != 200) return StatusOfHttp(status, where, body.substr(0, 512));
  PTC_ASSIGN_OR_RETURN(GenerationManifest m, DecodeManifest(where, body));
  if (m.generation != generation) {
    return CorruptionError(where + ": the peer sent generation " + std::to_string(m.generation));
  }
  return m;
}

Result<std::string> PeerClient::FetchPublished(const PeerAddress& peer, const std::string& name, uint64_t bytes,
                                               uint64_t checksum) const {
  const std::string where = "worker " + peer.ToString() + ": published '" + name + "'";
  HttpGetRequest get{peer,
                     PublishedTarget(name),
                     {{"Authorization", BearerHeader(options_.token)}},
                     Clock::now() + options_.timeout + std::chrono::seconds(bytes >> 23),
                     options_.stall};
  int status = 0;
  std::optional<uint64_t> length;
  std::string body, reason;
  uint64_t got = 0;
  auto on_head = [&](const HttpHead& head) {
    status = head.status;
    length = head.content_length;
    if (status != 200) return HttpBody{};
    if (length != bytes) return HttpBody{false};
    body.resize(static_cast<size_t>(bytes));  // received in place
    return HttpBody{true, body.data(), bytes};
  };
  auto on_body = [&](const char* data, size_t len) {
    got += len;
    if (status != 200) reason.append(data, std::min(len, 512 - std::min<size_t>(512, reason.size())));
    return true;
  };
  PTC_RETURN_IF_ERROR(HttpGet(get, on_head, on_body, pool_.get()), where);
  if (status != 200) return StatusOfHttp(status, where, reason);
  if (length != bytes || got != bytes) {
    return CorruptionError(where + ": " + (length ? std::to_string(*length) : std::string("unknown")) +
                           " bytes sent, " + std::to_string(bytes) + " expected");
  }
  if (Xxh64(body.data(), body.size()) != checksum) {
    return CorruptionError(where + ": its checksum differs from the one the change names");
  }
  return body;
}

}  // namespace ptc::cluster
