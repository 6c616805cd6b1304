// A cpp-httplib Stream over a connection the head gate handed on
// (head_gate.h): reads first consume the bytes the gate already received
// (the request head, and whatever followed it), then the socket; writes go
// to the socket. Reads past those bytes (a request body) share one deadline,
// so that a client trickling a body cannot keep a worker either; each write
// waits at most `write_timeout` for room in the socket.
//
// Thread safety: one thread at a time.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>

namespace ptc::cluster {

class ConnectionStream : public httplib::Stream {
 public:
  using Clock = std::chrono::steady_clock;

  // `fd` stays the caller's (non-blocking); `received` the bytes already read from it.
  ConnectionStream(int fd, std::string received, Clock::time_point read_deadline,
                   std::chrono::milliseconds write_timeout);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }

  // The received bytes not read yet (a pipelined next request).
  std::string TakeUnread();

 private:
  // Waits for `events` until `until`; false on a timeout, an error or a hang-up.
  bool Wait(short events, Clock::time_point until) const;

  const int fd_;
  std::string received_;
  size_t consumed_ = 0;
  const Clock::time_point read_deadline_;
  const std::chrono::milliseconds write_timeout_;
};

}  // namespace ptc::cluster
