// The pull between workers (issue 42): connections kept per peer
// (connection_pool.h) and spans fetched ahead of a sweep (peer_env.h).
//
// The pool against the real PeerServer (reuse counted) and against a scripted
// peer on loopback that closes kept connections, cuts bodies short or sends
// short ones: the bytes that arrive are the file's, or the error names the
// file and the span. The pipeline: a PeerEnv read in order, out of order and
// from several threads equals the file, each span fetched once; a change
// pulled through it by the executor lands bit for bit, and one whose source
// turns out corrupt mid-sweep commits nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "cluster/peer_client.h"
#include "cluster/peer_env.h"
#include "cluster/peer_server.h"
#include "ptc/base/checksum.h"
#include "ptc/base/mutex.h"
#include "ptc/store/shard_verify.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/execute.h"

namespace ptc::cluster {
namespace {

using testing::MakeStore;
using testing::Spec;
using testing::TempDir;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

// What the scripted peer does with the n-th request it reads (0-based, over
// all its connections) and the request's index on its connection.
struct Script {
  enum class Act { kServe, kCloseUnanswered, kCutBody, kShortBody };
  std::function<Act(int n, int on_connection)> act = [](int, int) { return Act::kServe; };
  bool close_after_each = false;  // closes after answering, without saying so
};

// A peer that answers GET /v1/shard?file=F&offset=O&length=L from `file_bytes`
// (the whole file F) as the server does, following `script`: one thread, one
// connection at a time.
class ScriptedPeer {
 public:
  ScriptedPeer(std::string file_bytes, Script script) : bytes_(std::move(file_bytes)), script_(std::move(script)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    address_ = {"127.0.0.1", ntohs(a.sin_port)};
    thread_ = std::thread([this] { Loop(); });
  }
  ~ScriptedPeer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  PeerAddress address() const { return address_; }
  int requests() const { return requests_; }
  int connections() const { return connections_; }

 private:
  void Loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      connections_++;
      for (int on_connection = 0; Answer(fd, on_connection); ++on_connection) {}
      ::close(fd);
    }
  }

  // Reads one request head and answers it; false when the connection ends.
  bool Answer(int fd, int on_connection) {
    std::string head;
    char c;
    while (head.find("\r\n\r\n") == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (stop_ || ::poll(&p, 1, 2000) <= 0 || ::recv(fd, &c, 1, 0) != 1) return false;
      head += c;
    }
    const int n = requests_++;
    auto param = [&](const std::string& name) {
      const size_t at = head.find(name + "=");
      return std::stoull(head.substr(at + name.size() + 1));
    };
    const uint64_t offset = param("offset"), length = param("length");
    const Script::Act act = script_.act(n, on_connection);
    if (act == Script::Act::kCloseUnanswered) return false;
    const uint64_t sent = act == Script::Act::kServe ? length : length / 2;
    const uint64_t said = act == Script::Act::kShortBody ? sent : length;
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(said) + "\r\n\r\n" +
                              bytes_.substr(static_cast<size_t>(offset), static_cast<size_t>(sent));
    if (::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(reply.size())) return false;
    return act != Script::Act::kCutBody && !script_.close_after_each;
  }

  const std::string bytes_;
  const Script script_;
  int listener_ = -1;
  PeerAddress address_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0}, connections_{0};
  std::thread thread_;
};

// A store whose embedding spans 8 checksum blocks (F32 16384 x 512 = 32 MiB),
// served on loopback by worker 0.
class Pull : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = Spec("megatron-gpt", "layers=1,hidden=512,heads=8,vocab=16384,seq=64");
    MakeStore(tmp_, spec_, *ParseConfig("tp=1,pp=1,dp=1"), 11);
    auto store = Store::Open(Env::Default(), tmp_ / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    PeerServerOptions o;
    o.token = kToken;
    o.threads = 4;
    auto server = PeerServer::Start(store_.get(), o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    for (const ShardRecord& s : store_->current().shards) {
      if (big_ == nullptr || s.nbytes > big_->nbytes) big_ = &s;
    }
    ASSERT_EQ(BlockCount(*big_), 8u);
  }

  PeerClientOptions ClientOptions() {
    PeerClientOptions o;
    o.token = kToken;
    o.timeout = std::chrono::seconds(20);
    o.max_request_bytes = kChecksumBlockBytes;  // a request per block: several per shard
    return o;
  }

  std::string Local(const ShardRecord& s, uint64_t offset, uint64_t n) {
    std::string out(n, '\0');
    EXPECT_TRUE(ReadShardBytes(Env::Default(), *store_, s, offset, n, out.data()).ok());
    return out;
  }

  // The PeerEnv of worker 1 over a copy of the store's manifests at `root`
  // (its own directory empty: worker 0's files are read from the server).
  std::unique_ptr<PeerEnv> WorkerOneEnv(const std::string& root, size_t span_blocks = 1) {
    std::filesystem::copy(tmp_ / "store", root, std::filesystem::copy_options::recursive);
    for (const auto& gen : std::filesystem::directory_iterator(root)) {
      if (gen.is_directory()) std::filesystem::remove_all(gen.path() / "worker-00");
    }
    PeerEnvOptions o;
    o.self = 1;
    o.client = ClientOptions();
    o.span_blocks = span_blocks;
    auto env = std::make_unique<PeerEnv>(Env::Default(), root, o);
    env->SetManifests({store_->CurrentSnapshot()});
    env->SetPeers({{0, server_->address()}});
    return env;
  }

  TempDir tmp_;
  ModelSpec spec_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<PeerServer> server_;
  const ShardRecord* big_ = nullptr;
};

// Eight block requests in a row go over one connection: one connect, seven
// reuses; without a pool, a connection each.
TEST_F(Pull, AKeptConnectionCarriesTheNextRequests) {
  const uint64_t n = big_->nbytes;
  PeerClient pooled(ClientOptions());
  std::string got(n, '\0');
  ASSERT_TRUE(pooled.ReadShardRange(server_->address(), *big_, 0, n, got.data()).ok());
  EXPECT_TRUE(got == Local(*big_, 0, n));
  ConnectionPoolStats s = pooled.pool_stats();
  EXPECT_EQ(s.connects, 1u);
  EXPECT_EQ(s.reuses, 7u);
  ASSERT_TRUE(pooled.FetchManifest(server_->address(), store_->current().generation).ok());  // the same one again
  EXPECT_EQ(pooled.pool_stats().connects, 1u);
  EXPECT_EQ(pooled.pool_stats().reuses, 8u);

  PeerClientOptions o = ClientOptions();
  o.pool.per_peer = 0;
  PeerClient unpooled(o);
  got.assign(n, '\0');
  ASSERT_TRUE(unpooled.ReadShardRange(server_->address(), *big_, 0, n, got.data()).ok());
  EXPECT_TRUE(got == Local(*big_, 0, n));
  EXPECT_EQ(unpooled.pool_stats().reuses, 0u);
  EXPECT_EQ(server_->stats().served, 8u + 1u + 8u);
}

// A kept connection the peer closed after answering (without saying so) is
// not used again; one it closes on receiving the next request is replaced by
// a fresh one for that request, whatever the attempts left (here none).
TEST_F(Pull, AKeptConnectionThePeerClosedIsReplaced) {
  const std::string file = testing::Slurp(store_->AbsPath(big_->file));
  PeerClientOptions o = ClientOptions();
  o.attempts = 1;
  {
    Script script;
    script.close_after_each = true;
    ScriptedPeer peer(file, script);
    PeerClient client(o);
    for (int i = 0; i < 3; ++i) {
      std::string got(kChecksumBlockBytes, '\0');
      Status s = client.ReadShardRange(peer.address(), *big_, i * kChecksumBlockBytes, got.size(), got.data());
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(got == Local(*big_, i * kChecksumBlockBytes, got.size()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the close has arrived
    }
    EXPECT_EQ(client.pool_stats().connects, 3u);
    EXPECT_EQ(client.pool_stats().reuses, 0u);
    EXPECT_EQ(client.pool_stats().stale, 2u);  // found closed when taken
    EXPECT_EQ(peer.requests(), 3);
  }
  Script script;
  script.act = [](int, int on_connection) {
    return on_connection == 1 ? Script::Act::kCloseUnanswered : Script::Act::kServe;
  };
  ScriptedPeer peer(file, script);
  PeerClient client(o);
  const uint64_t n = big_->nbytes;
  std::string got(n, '\0');
  Status s = client.ReadShardRange(peer.address(), *big_, 0, n, got.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == Local(*big_, 0, n));
  // Each connection answers one request and drops the second unanswered: 8
  // answered, 7 dropped, each drop followed by a fresh connection.
  EXPECT_EQ(peer.requests(), 15);
  EXPECT_EQ(client.pool_stats().connects, 8u);
  EXPECT_EQ(client.pool_stats().reuses, 7u);
  EXPECT_EQ(client.pool_stats().stale, 7u);
}

// A peer that cuts the body of a span short once: the span is asked again
// (on a fresh connection) and the bytes land exactly.
TEST_F(Pull, ASpanCutShortIsAskedAgain) {
  const std::string file = testing::Slurp(store_->AbsPath(big_->file));
  Script script;
  script.act = [](int n, int) { return n == 2 ? Script::Act::kCutBody : Script::Act::kServe; };
  ScriptedPeer peer(file, script);
  PeerClient client(ClientOptions());
  const uint64_t n = big_->nbytes;
  std::string got(n, '\0');
  Status s = client.ReadShardRange(peer.address(), *big_, 0, n, got.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == Local(*big_, 0, n));
  EXPECT_EQ(peer.requests(), 9);  // span 2 twice
  EXPECT_EQ(peer.connections(), 2);
}

// A body always cut short, or shorter than asked, is refused naming the
// peer, the file and the span, after the attempts.
TEST_F(Pull, ATruncatedBodyIsRefusedNamingTheFileAndSpan) {
  const std::string file = testing::Slurp(store_->AbsPath(big_->file));
  const std::string span =
      "bytes " + std::to_string(kChecksumBlockBytes) + "-" + std::to_string(2 * kChecksumBlockBytes);
  for (Script::Act act : {Script::Act::kCutBody, Script::Act::kShortBody}) {
    Script script;
    script.act = [act](int n, int) { return n == 0 ? Script::Act::kServe : act; };
    ScriptedPeer peer(file, script);
    PeerClientOptions o = ClientOptions();
    o.attempts = 2;
    PeerClient client(o);
    std::string got(2 * kChecksumBlockBytes, '\0');
    Status s = client.ReadShardRange(peer.address(), *big_, 0, got.size(), got.data());
    EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
    for (const std::string& part : {peer.address().ToString(), big_->file, span, std::string("attempt 2 of 2")}) {
      EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.ToString();
    }
    EXPECT_NE(s.message().find(act == Script::Act::kCutBody ? "bytes before the body's end" : "bytes received"),
              std::string::npos)
        << s.ToString();
    EXPECT_EQ(peer.requests(), 3);
  }
}

// A sweep in order through the env: every span fetched once (the next one
// ahead of the reader), the bytes the file's.
TEST_F(Pull, ASweepFetchesEachSpanOnceAhead) {
  auto env = WorkerOneEnv(tmp_ / "w1");
  auto file = env->OpenRead(tmp_ / ("w1/" + big_->file));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const uint64_t n = big_->nbytes, chunk = 1 << 20;
  std::string got(n, '\0');
  for (uint64_t at = 0; at < n; at += chunk) {
    ASSERT_TRUE((*file)->Read(big_->offset + at, std::min(chunk, n - at), got.data() + at).ok()) << at;
  }
  EXPECT_TRUE(got == Local(*big_, 0, n));
  const PeerEnv::Stats s = env->stats();
  EXPECT_EQ(s.requests, 8u);
  EXPECT_EQ(s.bytes, n);
  EXPECT_EQ(s.ahead, 7u);  // all but the first
  EXPECT_EQ(s.ahead_failed, 0u);
  EXPECT_EQ(s.connections.connects + s.connections.reuses, 8u);
  EXPECT_LE(s.connections.connects, 3u);  // the reader's and the fetchers' (ahead_spans 2)
}

// Out of order and from several threads at once: the same bytes.
TEST_F(Pull, ReadsInAnyOrderAndFromManyThreadsEqualTheFile) {
  auto env = WorkerOneEnv(tmp_ / "w1");
  auto file = env->OpenRead(tmp_ / ("w1/" + big_->file));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::string want = Local(*big_, 0, big_->nbytes);
  const uint64_t seed = testing::TestSeed();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<uint64_t> pieces;  // 512 KiB pieces, shuffled (thread 0: last to first)
      for (uint64_t at = 0; at < big_->nbytes; at += 512 << 10) pieces.push_back(at);
      if (t == 0)
        std::reverse(pieces.begin(), pieces.end());
      else
        std::shuffle(pieces.begin(), pieces.end(), rng);
      std::string got(big_->nbytes, '\0');
      for (uint64_t at : pieces) {
        const uint64_t n = std::min<uint64_t>(512 << 10, big_->nbytes - at);
        if (!(*file)->Read(big_->offset + at, n, got.data() + at).ok()) wrong++;
      }
      if (got != want) wrong++;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
}

// Worker 1 pulls a replica of every tensor (dp=2) through its env, the
// executor sweeping each source shard: the new pieces are the sources' bytes
// and checksums. With a block of the largest source corrupt on the serving
// side, the change fails naming it and commits nothing.
TEST_F(Pull, AChangePulledLandsExactlyAndACorruptSpanCommitsNothing) {
  const ParallelConfig to = *ParseConfig("tp=1,pp=1,dp=2,per_worker=1");
  transform::ExecuteOptions options;
  options.mode = transform::CommitMode::kWorkerLocal;
  options.threads = 2;
  {
    auto env = WorkerOneEnv(tmp_ / "good");
    auto store = Store::Open(env.get(), tmp_ / "good");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto r = transform::Transform(**store, to, options);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(env->stats().ahead, 0u);
    size_t pulled = 0;
    for (const ShardRecord& s : (*store)->current().shards) {
      if (s.worker != 1) continue;
      const ShardRecord* source = nullptr;
      for (const ShardRecord& x : store_->current().shards) {
        if (x.tensor == s.tensor && x.boxes == s.boxes) source = &x;
      }
      ASSERT_NE(source, nullptr) << s.tensor;
      std::string got(s.nbytes, '\0');
      ASSERT_TRUE(ReadShardBytes(Env::Default(), **store, s, 0, s.nbytes, got.data()).ok()) << s.file;
      EXPECT_TRUE(got == Local(*source, 0, source->nbytes)) << s.tensor;
      EXPECT_EQ(s.checksum, source->checksum) << s.tensor;
      pulled += s.nbytes;
    }
    EXPECT_EQ(pulled, r->bytes_written);
    EXPECT_GT(pulled, big_->nbytes);
  }
  std::string bytes = testing::Slurp(store_->AbsPath(big_->file));
  bytes[big_->offset + 5 * kChecksumBlockBytes + 3] ^= 0x10;
  testing::Spit(store_->AbsPath(big_->file), bytes);
  auto env = WorkerOneEnv(tmp_ / "bad");
  auto store = Store::Open(env.get(), tmp_ / "bad");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const uint64_t before = (*store)->current().generation;
  auto r = transform::Transform(**store, to, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("block 5"), std::string::npos) << r.status().ToString();
  EXPECT_EQ((*store)->current().generation, before);
  auto reopened = Store::Open(Env::Default(), tmp_ / "bad");
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->current().generation, before);
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp_ / "bad")) {
    EXPECT_EQ(e.path().string().find("worker-01"), std::string::npos) << e.path() << " left behind";
  }
}

}  // namespace
}  // namespace ptc::cluster
