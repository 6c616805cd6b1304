// The peer server under slow clients: connections that never send a request
// (idle) or send its head a byte at a time (slowloris) must neither keep a
// legitimate request waiting nor stay open past the head deadline
// (PeerServerOptions::head_timeout, docs/cluster.md).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cluster/peer_client.h"
#include "cluster/peer_server.h"
#include "ptc/store/shard_verify.h"
#include "synth_store.h"
#include "test_util.h"

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using testing::MakeStore;
using testing::Spec;
using testing::TempDir;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A connection opened without waiting for the server to accept it (the old
// server's backlog of 5 would block a plain connect).
int OpenNonBlocking(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0) (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  return fd;
}

// What the server sends on `fd` until it closes the connection or `seconds` pass.
std::string ReadUntilClosed(int fd, double seconds) {
  std::string got;
  const Clock::time_point t0 = Clock::now();
  while (Since(t0) < seconds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A connected loopback socket (blocking connect; the server's backlog takes it).
int Connect(int port) {
  const int fd = OpenNonBlocking(port);
  pollfd p{fd, POLLOUT, 0};
  ::poll(&p, 1, 2000);
  return fd;
}

std::string ManifestRequest(bool close) {
  return std::string("GET /v1/manifest?generation=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ") + kToken +
         "\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n";
}

// One slow or idle client: its socket and when the server closed it (< 0: open).
struct SlowClient {
  int fd = -1;
  Clock::time_point opened;
  double closed_after = -1;  // seconds from `opened`
  size_t sent = 0;           // bytes of the request head sent
};

// `idle` connections that send nothing and `slow` ones that send a request
// head one byte every `interval`, each watched for the server closing it.
class SlowSwarm {
 public:
  SlowSwarm(int port, int idle, int slow, std::chrono::milliseconds interval) : interval_(interval) {
    for (int i = 0; i < idle + slow; ++i) {
      SlowClient c;
      c.fd = OpenNonBlocking(port);
      c.opened = Clock::now();
      clients_.push_back(c);
    }
    slow_from_ = static_cast<size_t>(idle);
    thread_ = std::thread([this] { Run(); });
  }
  ~SlowSwarm() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (const SlowClient& c : clients_) ::close(c.fd);
  }
  // After the thread stopped: the clients.
  const std::vector<SlowClient>& Finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return clients_;
  }
  size_t slow_from() const { return slow_from_; }

 private:
  void Run() {
    static const std::string head = "GET /v1/shard?file=x&offset=0&length=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    Clock::time_point next_byte = Clock::now();
    while (!stop_) {
      const bool send_now = Clock::now() >= next_byte;
      if (send_now) next_byte += interval_;
      std::vector<pollfd> fds;
      for (SlowClient& c : clients_) fds.push_back({c.fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 20);
      for (size_t i = 0; i < clients_.size(); ++i) {
        SlowClient& c = clients_[i];
        if (c.closed_after >= 0) continue;
        char b;
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && ::recv(c.fd, &b, 1, MSG_DONTWAIT) <= 0) {
          c.closed_after = Since(c.opened);
          continue;
        }
        // Never the head's last byte: a slow client never completes its request.
        if (send_now && i >= slow_from_ && c.sent + 1 < head.size() &&
            ::send(c.fd, head.data() + c.sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++c.sent;
        }
      }
    }
  }

  const std::chrono::milliseconds interval_;
  std::vector<SlowClient> clients_;
  size_t slow_from_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PeerSlowClients : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelSpec spec = Spec("megatron-gpt", "layers=1,hidden=256,heads=4,vocab=1024,seq=64");
    MakeStore(tmp_, spec, *ParseConfig("tp=1,pp=1,dp=1"), 3);
    auto store = Store::Open(Env::Default(), tmp_ / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    shard_ = &store_->current().shards.front();
    PeerServerOptions o;
    o.token = kToken;  // the defaults otherwise: 8 threads, the default head deadline
    Restart(o);
  }

  void Restart(const PeerServerOptions& o) {
    server_.reset();
    auto server = PeerServer::Start(store_.get(), o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // Reads 4 KiB of the shard as a worker does; the seconds it took.
  double TimedRead() {
    PeerClientOptions o;
    o.token = kToken;
    o.timeout = std::chrono::seconds(5);  // the old server would keep it waiting for far longer
    o.attempts = 1;
    const uint64_t n = std::min<uint64_t>(4096, shard_->nbytes);
    std::string got(n, '\0');
    const Clock::time_point t0 = Clock::now();
    Status s = PeerClient(o).ReadShardRange(server_->address(), *shard_, 0, n, got.data());
    const double took = Since(t0);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::string want(n, '\0');
    EXPECT_TRUE(ReadShardBytes(Env::Default(), *store_, *shard_, 0, n, want.data()).ok());
    EXPECT_TRUE(got == want) << "the bytes read differ from the shard's";
    return took;
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<PeerServer> server_;
  const ShardRecord* shard_ = nullptr;
};

// 100 idle and 100 slowloris connections (a byte every 300 ms: far more
// often than any per-read timeout, so only a deadline on the whole head ends
// them). A legitimate read is served within a second, several times over,
// and every slow connection is closed by the server after the head
// deadline, not before and not long after.
TEST_F(PeerSlowClients, ALegitimateReadIsServedWithinASecond) {
  const double deadline = std::chrono::duration<double>(PeerServerOptions{}.head_timeout).count();
  ASSERT_LE(deadline, 3.0) << "the test waits for the head deadline";
  SlowSwarm swarm(server_->address().port, 100, 100, std::chrono::milliseconds(300));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the swarm holds whatever it can
  for (int i = 0; i < 3; ++i) {
    const double took = TimedRead();
    EXPECT_LT(took, 1.0) << "read " << i << " under 100 idle and 100 slow connections";
  }
  // Past the deadline (with a margin for a loaded machine), every one is closed.
  std::this_thread::sleep_for(std::chrono::duration<double>(deadline + 1.5) - std::chrono::milliseconds(300));
  const std::vector<SlowClient>& clients = swarm.Finish();
  size_t open = 0, early = 0, slow_sent = 0;
  for (size_t i = 0; i < clients.size(); ++i) {
    const SlowClient& c = clients[i];
    if (c.closed_after < 0) ++open;
    if (c.closed_after >= 0 && c.closed_after < deadline - 0.2) ++early;
    if (i >= swarm.slow_from()) slow_sent += c.sent;
  }
  EXPECT_EQ(open, 0u) << "connections still open " << deadline + 1.5 << " s after they were opened";
  EXPECT_EQ(early, 0u) << "connections closed before the head deadline of " << deadline << " s";
  EXPECT_GE(slow_sent, 100u * 2) << "the slow clients kept sending";
  EXPECT_EQ(server_->stats().head_timeouts, 200u);
  // And the server serves as before.
  EXPECT_LT(TimedRead(), 1.0);
}

// Kept-alive connections go back to the gate between requests: two requests
// sent in one write (pipelined) are both answered, a third after a pause
// too, and "Connection: close" ends the connection.
TEST_F(PeerSlowClients, KeptAliveAndPipelinedRequestsAreServed) {
  const int fd = Connect(server_->address().port);
  const std::string two = ManifestRequest(false) + ManifestRequest(false);
  ASSERT_EQ(::send(fd, two.data(), two.size(), MSG_NOSIGNAL), static_cast<ssize_t>(two.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::string last = ManifestRequest(true);
  ASSERT_EQ(::send(fd, last.data(), last.size(), MSG_NOSIGNAL), static_cast<ssize_t>(last.size()));
  const std::string got = ReadUntilClosed(fd, 5);
  ::close(fd);
  EXPECT_EQ(Count(got, "HTTP/1.1 200 OK\r\n"), 3u) << got.substr(0, 300);
  EXPECT_EQ(Count(got, "\"generation\""), 3u) << "three manifests";
  EXPECT_EQ(Count(got, "Connection: close\r\n"), 1u);
  EXPECT_EQ(server_->stats().served, 3u);
  EXPECT_EQ(server_->stats().head_timeouts, 0u);
}

// A kept-alive connection with no next request ends after the keep-alive
// wait (2 s), not counted as a late head; a head longer than the limit ends
// its connection at once, without an answer.
TEST_F(PeerSlowClients, IdleKeptAliveAndOversizedHeadsAreClosed) {
  const int fd = Connect(server_->address().port);
  const std::string one = ManifestRequest(false);
  ASSERT_EQ(::send(fd, one.data(), one.size(), MSG_NOSIGNAL), static_cast<ssize_t>(one.size()));
  const Clock::time_point t0 = Clock::now();
  const std::string got = ReadUntilClosed(fd, 6);
  const double closed_after = Since(t0);
  ::close(fd);
  EXPECT_EQ(Count(got, "HTTP/1.1 200 OK\r\n"), 1u);
  EXPECT_GT(closed_after, 1.8);
  EXPECT_LT(closed_after, 4.0);
  EXPECT_EQ(server_->stats().head_timeouts, 0u);

  const int big = Connect(server_->address().port);
  const std::string head = "GET /v1/manifest?generation=1 HTTP/1.1\r\nX: " + std::string(32 << 10, 'a');
  (void)::send(big, head.data(), head.size(), MSG_NOSIGNAL);
  const Clock::time_point t1 = Clock::now();
  EXPECT_EQ(ReadUntilClosed(big, 5), "");
  EXPECT_LT(Since(t1), 1.0) << "closed at once, not at the head deadline";
  ::close(big);
  EXPECT_EQ(server_->stats().served, 1u);
}

// More connections waiting for their heads than max_waiting: the longest
// waiting are closed to make room, and a legitimate read is still served.
TEST_F(PeerSlowClients, TheLongestWaitingMakeRoom) {
  PeerServerOptions o;
  o.token = kToken;
  o.max_waiting = 16;
  o.head_timeout = std::chrono::seconds(30);  // only eviction ends them here
  Restart(o);
  SlowSwarm swarm(server_->address().port, 40, 0, std::chrono::milliseconds(300));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(TimedRead(), 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::vector<SlowClient>& clients = swarm.Finish();
  size_t closed = 0;
  for (const SlowClient& c : clients) closed += c.closed_after >= 0 ? 1 : 0;
  EXPECT_GE(closed, 40u - 16u);
  EXPECT_LE(closed, 40u - 16u + 1u);  // the read's own connection took one place
  EXPECT_EQ(server_->stats().evicted, closed);
  EXPECT_EQ(server_->stats().head_timeouts, 0u);
}

TEST_F(PeerSlowClients, StartRefusesBadLimits) {
  PeerServerOptions o;
  o.token = kToken;
  o.head_timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(PeerServer::Start(store_.get(), o).status().code(), Code::kInvalidArgument);
  o.head_timeout = std::chrono::seconds(1);
  o.max_waiting = 0;
  EXPECT_EQ(PeerServer::Start(store_.get(), o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ptc::cluster
