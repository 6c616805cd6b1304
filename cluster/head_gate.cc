// The peer server's accept loop: one thread polls the listening socket and
// every connection still sending its request head.
#include "cluster/head_gate.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "cluster/peer_protocol.h"
#include "ptc/base/mutex.h"

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;

void CloseConnection(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

// A connection waiting for its head. The gate thread's own.
struct Waiting {
  int fd = -1;
  std::string bytes;
  int requests = 0;
  size_t searched = 0;       // bytes of `bytes` searched for the head's end
  Clock::time_point since;   // waiting since (the longest waiting is evicted first)
  Clock::time_point deadline;
  bool idle = false;  // kept alive, nothing of its next request yet: the deadline is keep_alive_timeout's
};

// A listening socket on address:port: (fd, bound port).
Result<std::pair<int, int>> ListenOn(const std::string& address, int port) {
  const std::string where = PeerAddress{address, port}.ToString();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) return IOError(where + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(list, ::freeaddrinfo);
  Status last = IOError(where + ": no address");
  for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = ErrnoError(where + ": socket", errno);
      continue;
    }
    // SO_REUSEADDR only: SO_REUSEPORT would let a second server (another
    // daemon of the same user) bind our port and take part of the connections.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last = ErrnoError(where + ": bind", errno);
      ::close(fd);
      continue;
    }
    // SOMAXCONN: the kernel caps it at net.core.somaxconn (4096 since Linux 5.4).
    if (::listen(fd, SOMAXCONN) != 0) {
      last = ErrnoError(where + ": listen", errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int p = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return std::make_pair(fd, p);
  }
  return last;
}

}  // namespace

size_t HeadEnd(const std::string& bytes, size_t from) {
  const size_t at = bytes.find("\r\n\r\n", from);
  return at == std::string::npos ? 0 : at + 4;
}

struct HeadGate::Impl {
  explicit Impl(HeadGateOptions o) : options(o) {}

  void Run();
  // Takes what arrived on `w`; false when `w` is done here (handed on or closed).
  bool Receive(Waiting& w, Clock::time_point now);
  // Accepts every pending connection.
  void Accept(Clock::time_point now);
  // Adds `w`, evicting the longest waiting when max_waiting are.
  void Add(Waiting w);
  // Hands `w` on when its head is complete (true), else records what was searched.
  bool HandOnIfComplete(Waiting& w);

  const HeadGateOptions options;
  Ready ready;  // set by Start, before the thread starts
  int listener = -1;
  int wake = -1;  // an eventfd: Return and Stop wake the thread
  int port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  Clock::time_point listener_paused_until;  // out of descriptors: accept again after this

  std::vector<Waiting> waiting;  // the thread's only

  Mutex mu;
  std::vector<ReadyConnection> returned GUARDED_BY(mu);
  bool closed GUARDED_BY(mu) = false;  // stopped: Return closes

  Mutex stop_mu;
  bool stopped GUARDED_BY(stop_mu) = false;

  std::atomic<uint64_t> accepted{0}, head_timeouts{0}, evicted{0}, oversized{0};
};

bool HeadGate::Impl::HandOnIfComplete(Waiting& w) {
  if (HeadEnd(w.bytes, w.searched) == 0) {
    w.searched = w.bytes.size() < 3 ? 0 : w.bytes.size() - 3;
    return false;
  }
  ready(ReadyConnection{w.fd, std::move(w.bytes), w.requests});
  return true;
}

void HeadGate::Impl::Add(Waiting w) {
  if (waiting.size() >= options.max_waiting && !waiting.empty()) {
    auto oldest = std::min_element(waiting.begin(), waiting.end(),
                                   [](const Waiting& a, const Waiting& b) { return a.since < b.since; });
    CloseConnection(oldest->fd);
    evicted.fetch_add(1, std::memory_order_relaxed);
    *oldest = std::move(waiting.back());
    waiting.pop_back();
  }
  waiting.push_back(std::move(w));
}

void HeadGate::Impl::Accept(Clock::time_point now) {
  for (;;) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection stays queued; polling the listener now would spin.
        listener_paused_until = now + std::chrono::milliseconds(10);
      }
      return;  // EAGAIN: no more
    }
    accepted.fetch_add(1, std::memory_order_relaxed);
    int yes = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    Add(Waiting{fd, {}, 0, 0, now, now + options.head_timeout, false});
  }
}

bool HeadGate::Impl::Receive(Waiting& w, Clock::time_point now) {
  char buf[4096];
  bool ended = false;
  while (w.bytes.size() <= options.max_head_bytes) {
    const ssize_t r = ::recv(w.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r > 0) {
      w.bytes.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    ended = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  if (w.idle && !w.bytes.empty()) {
    w.idle = false;
    w.deadline = now + options.head_timeout;
  }
  // A complete head is served even when the client has shut its side.
  if (HandOnIfComplete(w)) return false;
  if (w.bytes.size() > options.max_head_bytes) {
    oversized.fetch_add(1, std::memory_order_relaxed);
    ended = true;
  }
  if (ended) CloseConnection(w.fd);
  return !ended;
}

void HeadGate::Impl::Run() {
  std::vector<pollfd> fds;
  while (!stopping.load()) {
    Clock::time_point now = Clock::now();
    std::vector<ReadyConnection> back;
    {
      MutexLock lock(&mu);
      back.swap(returned);
    }
    for (ReadyConnection& c : back) {
      Waiting w{c.fd, std::move(c.bytes), c.requests, 0, now, now + options.keep_alive_timeout, true};
      if (!w.bytes.empty()) {  // pipelined: the next request has begun
        w.idle = false;
        w.deadline = now + options.head_timeout;
      }
      if (!HandOnIfComplete(w)) Add(std::move(w));
    }

    // The earliest deadline bounds the wait.
    Clock::time_point until = Clock::time_point::max();
    for (const Waiting& w : waiting) until = std::min(until, w.deadline);
    const bool listen_now = now >= listener_paused_until;
    if (!listen_now) until = std::min(until, listener_paused_until);
    fds.clear();
    fds.push_back({wake, POLLIN, 0});
    fds.push_back({listen_now ? listener : -1, POLLIN, 0});
    for (const Waiting& w : waiting) fds.push_back({w.fd, POLLIN, 0});
    int timeout_ms = -1;
    if (until != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // ENOMEM: try again
      continue;
    }
    if (fds[0].revents != 0) {
      uint64_t n;
      (void)!::read(wake, &n, sizeof(n));
    }

    now = Clock::now();
    std::vector<Waiting> still;
    still.reserve(waiting.size());
    for (size_t i = 0; i < waiting.size(); ++i) {
      Waiting& w = waiting[i];
      if (fds[i + 2].revents != 0 && !Receive(w, now)) continue;
      if (now >= w.deadline) {
        CloseConnection(w.fd);
        // An idle kept-alive connection ends as HTTP keep-alive does; only a
        // request's head can be late.
        if (!w.idle) head_timeouts.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      still.push_back(std::move(w));
    }
    waiting.swap(still);
    if (fds[1].revents != 0) Accept(now);
  }
  for (const Waiting& w : waiting) CloseConnection(w.fd);
  waiting.clear();
}

HeadGate::HeadGate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HeadGate::~HeadGate() { Stop(); }

Result<std::unique_ptr<HeadGate>> HeadGate::Listen(const std::string& address, int port, HeadGateOptions options) {
  PTC_ASSIGN_OR_RETURN(auto listening, ListenOn(address, port));
  auto impl = std::make_unique<Impl>(options);
  impl->listener = listening.first;
  impl->port = listening.second;
  impl->wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake < 0) {
    ::close(impl->listener);
    return ErrnoError(PeerAddress{address, impl->port}.ToString() + ": eventfd", errno);
  }
  return std::unique_ptr<HeadGate>(new HeadGate(std::move(impl)));
}

int HeadGate::port() const { return impl_->port; }

void HeadGate::Start(Ready ready) {
  MutexLock lock(&impl_->stop_mu);
  if (impl_->stopped || impl_->thread.joinable()) return;
  impl_->ready = std::move(ready);
  impl_->thread = std::thread([d = impl_.get()] { d->Run(); });
}

void HeadGate::Return(ReadyConnection c) {
  {
    MutexLock lock(&impl_->mu);
    if (!impl_->closed) {
      impl_->returned.push_back(std::move(c));
      const uint64_t one = 1;
      (void)!::write(impl_->wake, &one, sizeof(one));  // under mu: Stop closes it once closed is set
      return;
    }
  }
  CloseConnection(c.fd);
}

HeadGateStats HeadGate::stats() const {
  return HeadGateStats{impl_->accepted.load(), impl_->head_timeouts.load(), impl_->evicted.load(),
                       impl_->oversized.load()};
}

void HeadGate::Stop() {
  Impl& d = *impl_;
  MutexLock lock(&d.stop_mu);
  if (d.stopped) return;
  d.stopped = true;
  d.stopping = true;
  const uint64_t one = 1;
  (void)!::write(d.wake, &one, sizeof(one));
  if (d.thread.joinable()) d.thread.join();
  ::close(d.listener);
  std::vector<ReadyConnection> back;
  {
    MutexLock l(&d.mu);
    d.closed = true;
    back.swap(d.returned);
  }
  for (const ReadyConnection& c : back) CloseConnection(c.fd);
  ::close(d.wake);
}

}  // namespace ptc::cluster
