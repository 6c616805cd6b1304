#include "cluster/connection_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ptc::cluster {
namespace {

using Clock = ConnectionStream::Clock;

void IpAndPort(const sockaddr_storage& a, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

}  // namespace

ConnectionStream::ConnectionStream(int fd, std::string received, Clock::time_point read_deadline,
                                   std::chrono::milliseconds write_timeout)
    : fd_(fd), received_(std::move(received)), read_deadline_(read_deadline), write_timeout_(write_timeout) {}

bool ConnectionStream::Wait(short events, Clock::time_point until) const {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    // A hang-up still lets the bytes before it be read.
    return (p.revents & events) != 0;
  }
}

bool ConnectionStream::is_readable() const {
  return consumed_ < received_.size() || Wait(POLLIN, read_deadline_);
}

bool ConnectionStream::is_writable() const { return Wait(POLLOUT, Clock::now() + write_timeout_); }

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (consumed_ < received_.size()) {
    const size_t n = std::min(size, received_.size() - consumed_);
    std::memcpy(ptr, received_.data() + consumed_, n);
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }
  for (;;) {
    const ssize_t r = ::recv(fd_, ptr, size, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(POLLIN, read_deadline_)) return -1;
  }
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  for (;;) {
    const ssize_t r = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || !is_writable()) return -1;
  }
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) IpAndPort(a, ip, port);
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) IpAndPort(a, ip, port);
}

std::string ConnectionStream::TakeUnread() {
  std::string rest = received_.substr(consumed_);
  received_.clear();
  consumed_ = 0;
  return rest;
}

}  // namespace ptc::cluster
