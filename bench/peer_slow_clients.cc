// peer_slow_clients: the latency of a legitimate shard read from a
// PeerServer while other connections hold it idle or send their request
// heads a byte at a time (slowloris), as docs/cluster.md bounds it.
//
//   peer_slow_clients_bench [--clients N] [--interval-ms MS] [--requests R] [--gap-ms G] [--timeout-s S]
//
// Three scenarios, each on a fresh server (defaults: 8 threads) over a small
// synthetic store on loopback: no other clients; N connections that send
// nothing; N that send one byte of a request head every MS (default 4000).
// The other clients connect one every 2 ms (so that a small listen backlog
// takes them rather than SYN cookies hiding them) and reconnect whenever the
// server closes one, keeping N open as an attacker would. In each scenario,
// R reads of 4 KiB (PeerClient, one attempt, no stall limit: the time until
// the server answers) one after the other, G ms apart (default 500: the reads
// outlast the server's head deadline, so some meet the reopened connections),
// starting 500 ms after the others connected. Prints a Markdown table row per scenario: median and slowest
// read in ms, reads that failed by the S-second deadline, and how many of the
// other connections the server closed (each then reopened).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cluster/peer_client.h"
#include "cluster/peer_server.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"
#include "ptc/store/store.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "bench-token-0123456789abcdef0123";

int OpenNonBlocking(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0) (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  return fd;
}

// n connections; when `interval` > 0 each sends a request head one byte per
// interval (never the last byte). One the server closes is opened again.
class Swarm {
 public:
  Swarm(int port, int n, std::chrono::milliseconds interval) : port_(port), interval_(interval) {
    for (int i = 0; i < n; ++i) {
      fds_.push_back(OpenNonBlocking(port));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    sent_.assign(fds_.size(), 0);
    thread_ = std::thread([this] { Run(); });
  }
  ~Swarm() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  // Connections the server closed.
  size_t Closed() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return closed_;
  }

 private:
  void Run() {
    static const std::string head = "GET /v1/shard?file=x&offset=0&length=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    Clock::time_point next = Clock::now();
    while (!stop_) {
      const bool send_now = interval_.count() > 0 && Clock::now() >= next;
      if (send_now) next += interval_;
      std::vector<pollfd> p;
      for (int fd : fds_) p.push_back({fd, POLLIN, 0});
      ::poll(p.data(), p.size(), 20);
      for (size_t i = 0; i < fds_.size(); ++i) {
        char b;
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && ::recv(fds_[i], &b, 1, MSG_DONTWAIT) <= 0) {
          ++closed_;
          ::close(fds_[i]);
          fds_[i] = OpenNonBlocking(port_);
          sent_[i] = 0;
          continue;
        }
        if (send_now && sent_[i] + 1 < head.size() &&
            ::send(fds_[i], head.data() + sent_[i], 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++sent_[i];
        }
      }
    }
  }

  const int port_;
  const std::chrono::milliseconds interval_;
  std::vector<int> fds_;
  std::vector<size_t> sent_;
  size_t closed_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "peer_slow_clients: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 100, requests = 5, timeout_s = 60;
  int interval_ms = 4000, gap_ms = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--clients") clients = v;
    else if (flag == "--interval-ms") interval_ms = v;
    else if (flag == "--requests") requests = v;
    else if (flag == "--gap-ms") gap_ms = v;
    else if (flag == "--timeout-s") timeout_s = v;
    else return Fail("unknown flag " + flag);
  }

  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("peer_slow_clients." + std::to_string(::getpid()));
  fs::remove_all(tmp);
  ptc::ModelSpec spec;
  spec.schema = *ptc::LoadSchema("megatron-gpt");
  spec.dims = *ptc::ParseDims("layers=1,hidden=256,heads=4,vocab=1024,seq=64");
  const ptc::ParallelConfig config = *ptc::ParseConfig("tp=1,pp=1,dp=1");
  if (ptc::Status s =
          ptc::WriteSynthCheckpoint(ptc::Env::Default(), *ptc::ModelLayout::Make(spec, config), 1, tmp / "src");
      !s.ok()) {
    return Fail(s.ToString());
  }
  auto imported = ptc::ImportCheckpoint(ptc::Env::Default(), tmp / "src", tmp / "store", spec.schema, spec.dims, config);
  if (!imported.ok()) return Fail(imported.status().ToString());
  auto store = ptc::Store::Open(ptc::Env::Default(), tmp / "store");
  if (!store.ok()) return Fail(store.status().ToString());
  const ptc::ShardRecord& shard = (*store)->current().shards.front();

  std::printf("| other connections | reads | median ms | slowest ms | failed | closed by the server (reopened) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  struct Scenario {
    std::string name;
    int n;
    int interval_ms;
  };
  const std::vector<Scenario> scenarios = {
      {"none", 0, 0},
      {std::to_string(clients) + " idle", clients, 0},
      {std::to_string(clients) + " slow (1 byte / " + std::to_string(interval_ms) + " ms)", clients, interval_ms}};
  for (const Scenario& sc : scenarios) {
    ptc::cluster::PeerServerOptions so;
    so.token = kToken;
    auto server = ptc::cluster::PeerServer::Start(store->get(), so);
    if (!server.ok()) return Fail(server.status().ToString());
    std::vector<double> ms;
    int failed = 0;
    size_t closed = 0;
    {
      Swarm swarm((*server)->address().port, sc.n, std::chrono::milliseconds(sc.interval_ms));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ptc::cluster::PeerClientOptions co;
      co.token = kToken;
      co.timeout = std::chrono::seconds(timeout_s);
      co.attempts = 1;
      co.stall = std::chrono::milliseconds(0);
      std::string got(std::min<uint64_t>(4096, shard.nbytes), '\0');
      for (int r = 0; r < requests; ++r) {
        if (r > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        const Clock::time_point t0 = Clock::now();
        ptc::Status s =
            ptc::cluster::PeerClient(co).ReadShardRange((*server)->address(), shard, 0, got.size(), got.data());
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (!s.ok()) {
          ++failed;
          std::fprintf(stderr, "%s: read %d: %s\n", sc.name.c_str(), r, s.ToString().c_str());
        }
      }
      closed = swarm.Closed();
    }
    (*server)->Stop();
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    std::printf("| %s | %d | %.1f | %.1f | %d | %zu |\n", sc.name.c_str(), requests, sorted[sorted.size() / 2],
                sorted.back(), failed, closed);
    std::fflush(stdout);
  }
  fs::remove_all(tmp);
  return 0;
}
