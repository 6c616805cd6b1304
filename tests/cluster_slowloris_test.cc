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

namespace ptc {
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
    PeerServerOptions o;
    o.token = kToken;  // the defaults otherwise: 8 threads, the default head deadline
    auto server = PeerServer::Start(store_.get(), o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    shard_ = &store_->current().shards.front();
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

}  // namespace
}  // namespace ptc
