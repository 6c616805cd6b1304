#include "cluster/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kHeadLimit = 64 << 10;
constexpr size_t kReadBytes = 1 << 20;

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  // The descriptor, no longer closed here.
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// When a wait gives up: the request's deadline, or `stall` without progress.
struct Limits {
  Clock::time_point deadline;
  std::chrono::milliseconds stall{0};
};

// Waits until `fd` is ready for `events`, the deadline or the stall limit.
Status Wait(int fd, short events, const Limits& limits, const std::string& where) {
  const Clock::time_point stalled =
      limits.stall.count() > 0 ? Clock::now() + limits.stall : Clock::time_point::max();
  for (;;) {
    const auto now = Clock::now();
    if (now >= limits.deadline) return IOError(where + ": deadline passed");
    if (now >= stalled) {
      return IOError(where + ": nothing from the peer for " + std::to_string(limits.stall.count()) +
                     " ms (is it or its link gone?)");
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(limits.deadline, stalled) - now);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1 << 30)));
    if (r > 0) return Status::OK();
    if (r < 0 && errno != EINTR) return ErrnoError(where + ": poll", errno);
  }
}

Result<std::unique_ptr<Socket>> Connect(const PeerAddress& peer, const Limits& limits, const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(peer.host.c_str(), std::to_string(peer.port).c_str(), &hints, &list);
  if (rc != 0) return IOError(where + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(list, ::freeaddrinfo);
  Status last = IOError(where + ": no address");
  for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
    auto s = std::make_unique<Socket>(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (s->fd() < 0) {
      last = ErrnoError(where + ": socket", errno);
      continue;
    }
    if (::connect(s->fd(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = ErrnoError(where + ": connect", errno);
      continue;
    }
    if (Status w = Wait(s->fd(), POLLOUT, limits, where + ": connect"); !w.ok()) {
      last = w;
      continue;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(s->fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      last = ErrnoError(where + ": connect", err);
      continue;
    }
    return s;
  }
  return last;
}

// Receives up to n bytes (at least one, or 0 at the end of the stream).
Result<size_t> Receive(int fd, char* dst, size_t n, const Limits& limits, const std::string& where) {
  for (;;) {
    const ssize_t r = ::recv(fd, dst, n, 0);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoError(where + ": recv", errno);
    PTC_RETURN_IF_ERROR(Wait(fd, POLLIN, limits, where));
  }
}

Status SendAll(int fd, std::string_view data, const Limits& limits, const std::string& where) {
  while (!data.empty()) {
    const ssize_t r = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (r > 0) {
      data.remove_prefix(static_cast<size_t>(r));
    } else if (r < 0 && errno != EINTR) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoError(where + ": send", errno);
      PTC_RETURN_IF_ERROR(Wait(fd, POLLOUT, limits, where));
    }
  }
  return Status::OK();
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

Result<HttpHead> ParseHttpHead(std::string_view head, const std::string& where) {
  auto bad = [&](const std::string& what) { return IOError(where + ": malformed response head (" + what + ")"); };
  const size_t eol = head.find("\r\n");
  const std::string_view status_line = head.substr(0, eol);
  if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12 || status_line[8] != ' ') return bad("status line");
  HttpHead out;
  for (char c : status_line.substr(9, 3)) {
    if (c < '0' || c > '9') return bad("status code");
    out.status = out.status * 10 + (c - '0');
  }
  std::string_view rest = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
  std::string_view connection;
  while (!rest.empty()) {
    const size_t end = rest.find("\r\n");
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return bad("header line");
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (EqualsIgnoringCase(name, "Content-Length")) {
      uint64_t n = 0;
      if (value.empty() || value.size() > 19) return bad("Content-Length");
      for (char c : value) {
        if (c < '0' || c > '9') return bad("Content-Length");
        n = n * 10 + static_cast<uint64_t>(c - '0');
      }
      out.content_length = n;
    } else if (EqualsIgnoringCase(name, "Transfer-Encoding") && !EqualsIgnoringCase(value, "identity")) {
      return bad("Transfer-Encoding " + std::string(value) + " is not supported");
    } else if (EqualsIgnoringCase(name, "Connection")) {
      connection = value;
    }
  }
  // HTTP/1.1 keeps a connection unless told otherwise; 1.0 closes it unless told otherwise.
  out.close = status_line[7] == '1' ? EqualsIgnoringCase(connection, "close")
                                    : !EqualsIgnoringCase(connection, "keep-alive");
  return out;
}

namespace {

// What one request on one connection came to.
struct Exchanged {
  Status status;
  bool reusable = false;           // the response read whole, the connection left open: it may carry another
  bool closed_unanswered = false;  // the peer closed or reset it before the response's first byte
};

// A send or receive that failed because the peer had closed the connection
// (not a timeout, not a silence).
bool ClosedByPeer(const Status& s) { return s.os_errno() == EPIPE || s.os_errno() == ECONNRESET; }

// Sends the request on `fd` and reads the response (HttpGet's contract).
Exchanged Exchange(int fd, const HttpGetRequest& request, bool keep, const Limits& limits, const std::string& where,
                   const std::function<HttpBody(const HttpHead&)>& on_head,
                   const std::function<bool(const char*, size_t)>& on_body) {
  std::string text = "GET " + request.target + " HTTP/1.1\r\nHost: " + request.peer.ToString() +
                     (keep ? "\r\n" : "\r\nConnection: close\r\n") + "Accept-Encoding: identity\r\n";
  for (const auto& [name, value] : request.headers) text += name + ": " + value + "\r\n";
  text += "\r\n";
  if (Status s = SendAll(fd, text, limits, where); !s.ok()) return {s, false, ClosedByPeer(s)};
  // The head, and whatever of the body came with it.
  std::string head_buf(kHeadLimit, '\0');
  size_t have = 0, head_end = std::string_view::npos;
  while (head_end == std::string_view::npos) {
    if (have >= kHeadLimit) return {IOError(where + ": response head larger than " + std::to_string(kHeadLimit))};
    Result<size_t> got = Receive(fd, head_buf.data() + have, kHeadLimit - have, limits, where);
    if (!got.ok()) return {got.status(), false, have == 0 && ClosedByPeer(got.status())};
    if (*got == 0) return {IOError(where + ": connection closed before the response head"), false, have == 0};
    have += *got;
    head_end = std::string_view(head_buf.data(), have).find("\r\n\r\n");
  }
  Result<HttpHead> head = ParseHttpHead(std::string_view(head_buf.data(), head_end), where);
  if (!head.ok()) return {head.status()};
  const HttpBody body = on_head(*head);
  if (!body.read) return {Status::OK()};
  // The body's destination: the caller's buffer, or one of ours reused for every read.
  const bool direct = body.into != nullptr && head->content_length && *head->content_length <= body.capacity;
  std::unique_ptr<char[]> own;
  if (!direct) own = std::make_unique_for_overwrite<char[]>(kReadBytes);
  uint64_t left = head->content_length.value_or(UINT64_MAX), received = 0;
  auto place = [&] { return direct ? body.into + received : own.get(); };
  // What came with the head first; more than the body: not a response to reuse the connection after.
  const size_t extra = have - (head_end + 4);
  size_t chunk = static_cast<size_t>(std::min<uint64_t>(extra, left));
  const bool clean = extra == chunk && head->content_length && !head->close;
  if (chunk > 0) std::memcpy(place(), head_buf.data() + head_end + 4, chunk);
  for (;;) {
    if (chunk > 0) {
      if (!on_body(place(), chunk)) return {Status::OK()};
      left -= chunk;
      received += chunk;
    }
    if (left == 0) return {Status::OK(), clean};
    Result<size_t> got =
        Receive(fd, place(), static_cast<size_t>(std::min<uint64_t>(kReadBytes, left)), limits, where);
    if (!got.ok()) return {got.status()};
    chunk = *got;
    if (chunk == 0) {
      if (!head->content_length) return {Status::OK()};
      return {IOError(where + ": connection closed " + std::to_string(left) + " bytes before the body's end")};
    }
  }
}

}  // namespace

Status HttpGet(const HttpGetRequest& request, const std::function<HttpBody(const HttpHead&)>& on_head,
               const std::function<bool(const char*, size_t)>& on_body, ConnectionPool* pool) {
  const std::string where = "peer " + request.peer.ToString();
  const Limits limits{request.deadline, request.stall};
  for (bool may_reuse = pool != nullptr;;) {
    const int kept = may_reuse ? pool->Take(request.peer) : -1;
    std::unique_ptr<Socket> socket;
    if (kept >= 0) {
      socket = std::make_unique<Socket>(kept);
    } else {
      PTC_ASSIGN_OR_RETURN(socket, Connect(request.peer, limits, where));
      if (pool != nullptr) pool->CountConnect();
    }
    Exchanged e = Exchange(socket->fd(), request, pool != nullptr, limits, where, on_head, on_body);
    if (kept >= 0 && e.closed_unanswered) {
      pool->CountStale();  // closed by the peer while kept: once more, on a fresh connection
      may_reuse = false;
      continue;
    }
    if (e.status.ok() && e.reusable && pool != nullptr) pool->Put(request.peer, socket->Release());
    return e.status;
  }
}

}  // namespace ptc::cluster
