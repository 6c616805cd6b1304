// The peer data plane over loopback sockets: a PeerServer serving a store
// imported from a synthetic checkpoint, PeerClients reading shard ranges
// (checked on arrival), and every refusal: tokens, paths, ranges.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "cluster/peer_client.h"
#include "cluster/peer_env.h"
#include "cluster/peer_protocol.h"
#include "cluster/peer_server.h"
#include "cluster/served_files.h"
#include "cluster/token.h"
#include "ptc/base/checksum.h"
#include "ptc/store/shard_verify.h"
#include "synth_store.h"
#include "test_util.h"

namespace ptc::cluster {
namespace {

using testing::MakeStore;
using testing::Spec;
using testing::TempDir;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

// The token file and its mode.
TEST(PeerToken, ReadsOnlyPrivateFiles) {
  TempDir tmp;
  const std::string path = tmp / "token";
  testing::Spit(path, std::string(kToken) + "\n");
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto t = ReadTokenFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, kToken);  // the newline is not part of it
  ASSERT_EQ(chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(ReadTokenFile(path).ok());
  for (mode_t mode : {0644, 0640, 0604, 0700, 0660}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    auto r = ReadTokenFile(path);
    ASSERT_FALSE(r.ok()) << std::oct << mode;
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied);
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(ReadTokenFile(tmp.path()).status().code(), Code::kPermissionDenied);  // a directory
  EXPECT_EQ(ReadTokenFile(tmp / "absent").status().code(), Code::kNotFound);
  // A FIFO (--token-file <(...)) is refused, not waited on in open(2) (issue 24).
  const std::string fifo = tmp / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return ReadTokenFile(fifo); });
  if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO";
    const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases it: it then reads EOF
    if (w >= 0) close(w);
  }
  EXPECT_EQ(read.get().status().code(), Code::kPermissionDenied);
  testing::Spit(path, "short\n");
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(ReadTokenFile(path).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(ValidateToken("has a space in the middle").ok());
  EXPECT_TRUE(TokenEquals("abc", "abc"));
  EXPECT_FALSE(TokenEquals("abc", "abd"));
  EXPECT_FALSE(TokenEquals("abc", "abcd"));
}

TEST(PeerProtocol, ParsesRequestsAndAddresses) {
  using P = std::multimap<std::string, std::string>;
  auto ok = ParseShardRequest(P{{"file", "gen-000001/worker-00/a.s0.h5"}, {"offset", "2048"}, {"length", "10"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, (ShardRequest{"gen-000001/worker-00/a.s0.h5", 2048, 10}));
  for (const P& bad :
       {P{{"offset", "0"}, {"length", "1"}}, P{{"file", "a"}, {"file", "b"}, {"offset", "0"}, {"length", "1"}},
        P{{"file", "a"}, {"offset", "-1"}, {"length", "1"}}, P{{"file", "a"}, {"offset", "1x"}, {"length", "1"}},
        P{{"file", "a"}, {"offset", "0"}, {"length", "0"}},
        P{{"file", "a"}, {"offset", "18446744073709551615"}, {"length", "2"}},
        P{{"file", "../manifest.json"}, {"offset", "0"}, {"length", "1"}},
        P{{"file", "/etc/passwd"}, {"offset", "0"}, {"length", "1"}},
        P{{"file", "gen-000001/./x"}, {"offset", "0"}, {"length", "1"}},
        P{{"file", "a"}, {"offset", "0"}, {"length", "1"}, {"extra", "1"}}}) {
    auto r = ParseShardRequest(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << (bad.count("file") ? bad.find("file")->second : "");
  }
  EXPECT_EQ(ShardRequestTarget({"gen-000001/worker-00/a b+c%.h5", 7, 9}),
            "/v1/shard?file=gen-000001/worker-00/a%20b%2Bc%25.h5&offset=7&length=9");
  EXPECT_EQ(*ParsePeerAddress("10.0.0.2:8470"), (PeerAddress{"10.0.0.2", 8470}));
  EXPECT_EQ(*ParsePeerAddress("[::1]:80"), (PeerAddress{"::1", 80}));
  EXPECT_EQ(ParsePeerAddress("[::1]:80")->ToString(), "[::1]:80");
  for (const char* bad : {"host", "host:0", "host:65536", ":80", "::1:80", "host:8x"}) {
    EXPECT_FALSE(ParsePeerAddress(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseBearer("Bearer abc"), "abc");
  EXPECT_FALSE(ParseBearer("Basic abc").has_value());
  EXPECT_FALSE(ParseBearer("Bearer ").has_value());
}

TEST(PeerProtocol, ServedFilesAreShardDataOnly) {
  auto m = std::make_shared<GenerationManifest>();
  m->generation = 3;
  ShardRecord s;
  s.file = "gen-000003/worker-00/w.s0.h5";
  s.offset = 2048;
  s.nbytes = 100;
  m->shards = {s};
  ServedFiles served({m, nullptr});
  EXPECT_EQ(served.generations(), std::vector<uint64_t>{3});
  EXPECT_TRUE(served.Check(s.file, 2048, 100).ok());
  EXPECT_TRUE(served.Check(s.file, 2147, 1).ok());
  EXPECT_EQ(served.Check(s.file, 0, 8).code(), Code::kInvalidArgument);  // the HDF5 superblock
  EXPECT_EQ(served.Check(s.file, 2047, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(served.Check(s.file, 2100, 49).code(), Code::kInvalidArgument);
  EXPECT_EQ(served.Check(s.file, UINT64_MAX, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(served.Check("gen-000003/manifest.json", 0, 1).code(), Code::kNotFound);
}

// A store with shards of several checksum blocks, served on loopback.
class PeerDataPlane : public ::testing::Test {
 protected:
  void SetUp() override {
    // F32 embedding 4096 x 512 = 8 MiB (two checksum blocks); MLP weights 6 MiB.
    spec_ = Spec("megatron-gpt", "layers=1,hidden=512,heads=8,vocab=4096,seq=64");
    MakeStore(tmp_, spec_, *ParseConfig("tp=1,pp=1,dp=1"), 7);
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
    ASSERT_GT(big_->nbytes, kChecksumBlockBytes);
  }

  PeerClientOptions ClientOptions(std::string token = kToken) {
    PeerClientOptions o;
    o.token = std::move(token);
    o.timeout = std::chrono::seconds(20);
    return o;
  }

  std::string Local(const ShardRecord& s, uint64_t offset, uint64_t n) {
    std::string out(n, '\0');
    EXPECT_TRUE(ReadShardBytes(Env::Default(), *store_, s, offset, n, out.data()).ok());
    return out;
  }

  // A raw GET with `auth` as the Authorization header ("" for none): (status, body).
  std::pair<int, std::string> RawGet(const std::string& target, const std::string& auth) {
    const PeerAddress a = server_->address();
    httplib::Client cli(a.host, a.port);
    httplib::Headers headers;
    if (!auth.empty()) headers.emplace("Authorization", auth);
    auto res = cli.Get(target, headers);
    if (!res) return {-1, httplib::to_string(res.error())};
    return {res->status, res->body};
  }

  // A piece of `data` at `offset` in a new file `name` beside the largest
  // shard's, which no manifest names yet.
  ShardRecord NewPiece(const std::string& name, const std::string& data, uint64_t offset) {
    ShardRecord piece = *big_;
    piece.file = DirName(big_->file) + "/" + name;
    testing::Spit(tmp_ / ("store/" + piece.file), std::string(offset, 'h') + data);
    ShardHasher hasher;
    hasher.Update(data.data(), data.size());
    piece.offset = offset;
    piece.nbytes = data.size();
    piece.checksum = hasher.Finish().checksum;
    piece.block_checksums.clear();
    piece.block_crc32s.clear();
    return piece;
  }

  TempDir tmp_;
  ModelSpec spec_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<PeerServer> server_;
  const ShardRecord* big_ = nullptr;
};

TEST_F(PeerDataPlane, RangesEqualTheFileBytes) {
  PeerClient client(ClientOptions());
  std::mt19937_64 rng(testing::TestSeed());
  const uint64_t B = kChecksumBlockBytes;
  const uint64_t n = big_->nbytes;
  // Whole shard, block-aligned, unaligned within a block, across a block boundary, the last byte.
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {{0, n},      {0, B},     {B, n - B},     {5, 17},
                                                       {B - 3, 10}, {n - 1, 1}, {B / 2, B + 1}, {0, 1}};
  for (int i = 0; i < 8; ++i) {
    const uint64_t off = rng() % n;
    ranges.emplace_back(off, 1 + rng() % (n - off));
  }
  for (auto [off, len] : ranges) {
    std::string got(len, '\0');
    Status s = client.ReadShardRange(server_->address(), *big_, off, len, got.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(got == Local(*big_, off, len)) << "bytes " << off << "+" << len;
  }
  // Every shard of the generation, whole, including the single-block ones; in requests of one block.
  PeerClientOptions small = ClientOptions();
  small.max_request_bytes = B;
  PeerClient one_block(small);
  for (const ShardRecord& s : store_->current().shards) {
    std::string got(s.nbytes, '\0');
    Status st = one_block.ReadShardRange(server_->address(), s, 0, s.nbytes, got.data());
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(got == Local(s, 0, s.nbytes)) << s.tensor;
  }
  EXPECT_TRUE(client.ReadShardRange(server_->address(), *big_, n, 0, nullptr).ok());
  EXPECT_EQ(client.ReadShardRange(server_->address(), *big_, n - 1, 2, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(server_->stats().refused, 0u);
}

TEST_F(PeerDataPlane, RefusesMissingOrWrongTokens) {
  const std::string target = ShardRequestTarget({big_->file, big_->offset, 16});
  EXPECT_EQ(RawGet(target, "").first, 401);
  EXPECT_EQ(RawGet(target, "Basic dXNlcjpwYXNz").first, 401);
  EXPECT_EQ(RawGet(target, "Bearer").first, 401);
  EXPECT_EQ(RawGet(target, "Bearer wrong-token-0123456789abcdef").first, 403);
  EXPECT_EQ(RawGet(target, std::string("Bearer ") + kToken + "x").first, 403);
  auto [status, body] = RawGet(target, std::string("Bearer ") + kToken);
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(body, Local(*big_, 0, 16));
  // Refused before anything else: not even an unknown path is told apart.
  EXPECT_EQ(RawGet("/v1/other", "").first, 401);

  PeerClient wrong(ClientOptions("wrong-token-0123456789abcdef"));
  std::string buf(16, '\0');
  Status s = wrong.ReadShardRange(server_->address(), *big_, 0, 16, buf.data());
  EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find(server_->address().ToString()), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(big_->tensor), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("403"), std::string::npos) << s.ToString();
  EXPECT_EQ(server_->stats().files_opened, 1u);  // the one good request
}

TEST_F(PeerDataPlane, RefusesEverythingTheManifestDoesNotName) {
  const std::string auth = std::string("Bearer ") + kToken;
  // Files that exist but are no shard's: an extra file next to the shards, the manifests, the lock.
  const std::string worker_dir = DirName(big_->file);
  testing::Spit(tmp_ / ("store/" + worker_dir + "/extra.bin"), std::string(4096, 'x'));
  struct Case {
    std::string target;
    int status;
  };
  const std::string f = big_->file;
  const std::vector<Case> cases = {
      {ShardRequestTarget({"../manifest.json", 0, 1}), 400},
      {"/v1/shard?file=..%2Fmanifest.json&offset=0&length=1", 400},
      {"/v1/shard?file=%2Fetc%2Fpasswd&offset=0&length=1", 400},
      {ShardRequestTarget({worker_dir + "/../../manifest.json", 0, 1}), 400},
      {ShardRequestTarget({"manifest.json", 0, 1}), 404},
      {ShardRequestTarget({"gen-000001/manifest.json", 0, 1}), 404},
      {ShardRequestTarget({"lock", 0, 1}), 404},
      {ShardRequestTarget({worker_dir + "/extra.bin", 0, 1}), 404},
      {ShardRequestTarget({worker_dir, 0, 1}), 404},
      // A shard file, outside its data: the HDF5 superblock, past the end, overflowing.
      {ShardRequestTarget({f, 0, 8}), 416},
      {ShardRequestTarget({f, big_->offset + big_->nbytes - 1, 2}), 416},
      {"/v1/shard?file=" + f + "&offset=18446744073709551615&length=1", 400},
      // Malformed or too large.
      {ShardRequestTarget({f, big_->offset, kDefaultMaxRequestBytes + 1}), 413},
      {"/v1/shard?file=" + f + "&offset=" + std::to_string(big_->offset) + "&length=0", 400},
      {"/v1/shard?file=" + f + "&offset=" + std::to_string(big_->offset), 400},
      {"/v1/shard?file=" + f + "&file=" + worker_dir + "/extra.bin&offset=0&length=1", 400},
      {"/v1/other", 404},
      {"/manifest.json", 404},
  };
  for (const Case& c : cases) {
    auto [status, body] = RawGet(c.target, auth);
    EXPECT_EQ(status, c.status) << c.target << ": " << body;
    EXPECT_NE(body.find("ptcfs peer: "), std::string::npos) << c.target << ": " << body;
  }
  EXPECT_EQ(server_->stats().files_opened, 0u);
  EXPECT_EQ(server_->stats().refused, cases.size());
  // A Range header is refused, not interpreted.
  const PeerAddress a = server_->address();
  httplib::Client cli(a.host, a.port);
  auto res = cli.Get(ShardRequestTarget({f, big_->offset, 16}), {{"Authorization", auth}, {"Range", "bytes=0-100"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  // The client maps the refusals to errors naming the peer and the shard.
  ShardRecord stray = *big_;
  stray.file = worker_dir + "/extra.bin";
  std::string buf(8, '\0');
  Status s = PeerClient(ClientOptions()).ReadShardRange(a, stray, 0, 8, buf.data());
  EXPECT_EQ(s.code(), Code::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("extra.bin"), std::string::npos) << s.ToString();
}

TEST_F(PeerDataPlane, CorruptedByteFailsOnArrival) {
  const uint64_t B = kChecksumBlockBytes;
  // Flip a byte in block 1 of the big shard, on the serving side.
  const std::string path = store_->AbsPath(big_->file);
  std::string bytes = testing::Slurp(path);
  bytes[big_->offset + B + 12345] ^= 0x40;
  testing::Spit(path, bytes);
  PeerClient client(ClientOptions());
  // Block 0 alone still verifies.
  std::string got(100, '\0');
  Status s = client.ReadShardRange(server_->address(), *big_, 10, 100, got.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Any range touching block 1 fails, even one that does not hold the bad byte.
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{{B + 12345, 1}, {B + 20000, 8}, {B - 4, 8}}) {
    got.assign(len, '\0');
    s = client.ReadShardRange(server_->address(), *big_, off, len, got.data());
    EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find(big_->tensor), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(big_->file), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(server_->address().ToString()), std::string::npos) << s.ToString();
  }
}

// A worker's PeerEnv reads another worker's shard files from its server:
// the bytes of the local files, checked on arrival (a corrupt block fails),
// and only files a manifest names, of a live worker.
TEST_F(PeerDataPlane, PeerEnvReadsAnotherWorkersFiles) {
  const std::string root = tmp_ / "worker1";  // worker 1's store: none of worker 0's files
  PeerEnvOptions o;
  o.self = 1;
  o.client = ClientOptions();
  PeerEnv env(Env::Default(), root, o);
  env.SetManifests({store_->CurrentSnapshot(), nullptr});
  const std::string path = root + "/" + big_->file;
  ASSERT_EQ(big_->worker, 0);
  EXPECT_EQ(env.RemoteWorker(path), 0);
  EXPECT_EQ(env.RemoteWorker(root + "/manifest.json"), -1);
  EXPECT_EQ(env.RemoteWorker(root + "/gen-000001/worker-01/x.h5"), -1);  // its own: local
  EXPECT_EQ(env.OpenRead(path).status().code(), Code::kIOError);        // worker 0 is not a member yet
  EXPECT_FALSE(env.Reachable(path));
  EXPECT_TRUE(env.Reachable(root + "/gen-000001/worker-01/x.h5"));
  env.SetPeers({{0, server_->address()}});
  EXPECT_TRUE(env.Exists(path));
  EXPECT_TRUE(env.Reachable(path));
  EXPECT_EQ(env.OpenRead(root + "/gen-000001/worker-00/unnamed.h5").status().code(), Code::kNotFound);
  auto file = env.OpenRead(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->VerifiesBlocks());
  EXPECT_EQ((*file)->Size(), big_->offset + big_->nbytes);
  const uint64_t B = kChecksumBlockBytes, n = big_->nbytes;
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{{0, n}, {B - 3, 10}, {5, 17}, {n - 1, 1}}) {
    std::string got(len, '\0');
    ASSERT_TRUE((*file)->Read(big_->offset + off, len, got.data()).ok());
    EXPECT_TRUE(got == Local(*big_, off, len)) << off;
  }
  EXPECT_EQ((*file)->Read(0, 1, nullptr).code(), Code::kNotFound);  // the HDF5 header is no shard data
  const PeerEnv::Stats before = env.stats();
  EXPECT_GT(before.cache_hits, 0u);  // the last reads were of blocks already fetched
  // A byte flipped on the serving side: a fresh env (nothing cached) fails naming the block.
  std::string bytes = testing::Slurp(store_->AbsPath(big_->file));
  bytes[big_->offset + B + 7] ^= 0x01;
  testing::Spit(store_->AbsPath(big_->file), bytes);
  PeerEnv fresh(Env::Default(), root, o);
  fresh.SetManifests({store_->CurrentSnapshot()});
  fresh.SetPeers({{0, server_->address()}});
  auto again = fresh.OpenRead(path);
  ASSERT_TRUE(again.ok());
  std::string one(1, '\0');
  EXPECT_TRUE((*again)->Read(big_->offset + 3, 1, one.data()).ok());  // block 0 is intact
  Status s = (*again)->Read(big_->offset + B + 7, 1, one.data());
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.ToString();
}

TEST_F(PeerDataPlane, ConcurrentClients) {
  const uint64_t seed = testing::TestSeed();
  std::vector<const ShardRecord*> shards;
  for (const ShardRecord& s : store_->current().shards) shards.push_back(&s);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      PeerClient client(ClientOptions());
      std::mt19937_64 rng(seed + t);
      for (int i = 0; i < 12; ++i) {
        const ShardRecord& s = *shards[rng() % shards.size()];
        const uint64_t off = rng() % s.nbytes;
        const uint64_t len = 1 + rng() % std::min<uint64_t>(s.nbytes - off, 3 << 20);
        std::string got(len, '\0');
        Status st = client.ReadShardRange(server_->address(), s, off, len, got.data());
        std::string want(len, '\0');
        if (!st.ok() || !ReadShardBytes(Env::Default(), *store_, s, off, len, want.data()).ok() || got != want) {
          ADD_FAILURE() << st.ToString() << " " << s.tensor << " " << off << "+" << len;
          failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(server_->stats().served, 8u * 12u);
}

TEST_F(PeerDataPlane, ServesKeptGenerations) {
  // A piece that only a kept generation (99) names.
  const std::string data = testing::Pattern(3, DType::kU8, 5000);
  const ShardRecord kept = NewPiece("kept.bin", data, 100);
  auto m = std::make_shared<GenerationManifest>();
  m->generation = 99;
  m->shards = {kept};
  PeerClient client(ClientOptions());
  std::string got(data.size(), '\0');
  EXPECT_EQ(client.ReadShardRange(server_->address(), kept, 0, data.size(), got.data()).code(), Code::kNotFound);
  server_->SetKeptGenerations({m});
  Status s = client.ReadShardRange(server_->address(), kept, 0, data.size(), got.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, data);
  // The current generation stays served.
  got.assign(64, '\0');
  EXPECT_TRUE(client.ReadShardRange(server_->address(), *big_, 0, 64, got.data()).ok());
  server_->SetKeptGenerations({});
  EXPECT_EQ(client.ReadShardRange(server_->address(), kept, 0, 10, got.data()).code(), Code::kNotFound);
}

// The pieces a worker wrote for a change are served from the moment its part
// is published, before the worker commits the change itself: a peer that
// committed first pulls them at once. Once the store is at the part's
// generation the part is not looked at any more, and another part of the same
// generation (an aborted change's, then the next) replaces it.
TEST_F(PeerDataPlane, ServesItsPartBeforeItCommits) {
  const std::string data = testing::Pattern(4, DType::kU8, 3000);
  const ShardRecord piece = NewPiece("part.bin", data, 0);
  const uint64_t g = store_->current().generation;
  auto part = [&](uint64_t generation, std::vector<ShardRecord> shards) {
    auto m = std::make_shared<GenerationManifest>();
    m->generation = generation;
    m->shards = std::move(shards);
    return m;
  };
  PeerClient client(ClientOptions());
  std::string got(data.size(), '\0');
  EXPECT_EQ(client.ReadShardRange(server_->address(), piece, 0, data.size(), got.data()).code(), Code::kNotFound);
  server_->ServePart(part(g + 1, {}));  // an aborted change's part: nothing of it is asked
  EXPECT_EQ(client.ReadShardRange(server_->address(), piece, 0, data.size(), got.data()).code(), Code::kNotFound);
  server_->ServePart(part(g + 1, {piece}));  // the next change, numbered the same
  Status s = client.ReadShardRange(server_->address(), piece, 0, data.size(), got.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, data);
  EXPECT_TRUE(client.ReadShardRange(server_->address(), *big_, 0, 64, got.data()).ok());  // and the current one
  // A part of the store's own generation or an older one is not served: the store's manifest is.
  server_->ServePart(part(g, {piece}));
  EXPECT_EQ(client.ReadShardRange(server_->address(), piece, 0, 10, got.data()).code(), Code::kNotFound);
}

// A worker that was away takes the job's generation from a peer: the
// manifest of the current or a kept generation, with the token, nothing else.
TEST_F(PeerDataPlane, ServesTheManifestOfItsGenerations) {
  PeerClient client(ClientOptions());
  const uint64_t g = store_->current().generation;
  auto got = client.FetchManifest(server_->address(), g);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, store_->current());
  auto other = client.FetchManifest(server_->address(), g + 7);
  EXPECT_EQ(other.status().code(), Code::kNotFound);
  EXPECT_NE(other.status().message().find("not served here (this worker is at generation " + std::to_string(g)),
            std::string::npos)
      << other.status().ToString();
  auto kept = std::make_shared<GenerationManifest>(store_->current());
  kept->generation = g + 7;
  server_->SetKeptGenerations({kept});
  got = client.FetchManifest(server_->address(), g + 7);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, *kept);
  EXPECT_EQ(PeerClient(ClientOptions("wrong-token-of-32-bytes-abcdefgh")).FetchManifest(server_->address(), g)
                .status()
                .code(),
            Code::kPermissionDenied);
  EXPECT_EQ(RawGet("/v1/manifest?generation=1", "").first, 401);
  const std::string bearer = "Bearer " + std::string(kToken);
  EXPECT_EQ(RawGet("/v1/manifest?generation=x", bearer).first, 400);
  EXPECT_EQ(RawGet("/v1/manifest?generation=1&file=a", bearer).first, 400);
  EXPECT_EQ(RawGet("/v1/manifest", bearer).first, 400);
}

// A DCP save's .metadata goes from its proposer to the job's other workers:
// published under the save's name while the change needs it, fetched whole,
// checked against the length and checksum the change names.
TEST_F(PeerDataPlane, PublishedBytesAreServedUntilWithdrawnAndCheckedOnArrival) {
  std::mt19937_64 rng(ptc::testing::TestSeed());
  std::string bytes(3 * (1 << 20) + 12345, '\0');  // more than one chunk of the stream
  for (char& c : bytes) c = static_cast<char>(rng());
  const uint64_t sum = Xxh64(bytes.data(), bytes.size());
  const std::string name = ".dcp/step 7&x=1+2%";  // the query's own characters too
  PeerClient client(ClientOptions());
  EXPECT_EQ(client.FetchPublished(server_->address(), name, bytes.size(), sum).status().code(), Code::kNotFound);
  server_->Publish(name, std::make_shared<const std::string>(bytes));
  ASSERT_NE(server_->Published(name), nullptr);
  auto got = client.FetchPublished(server_->address(), name, bytes.size(), sum);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == bytes);
  auto other_sum = client.FetchPublished(server_->address(), name, bytes.size(), sum ^ 1);
  EXPECT_EQ(other_sum.status().code(), Code::kCorruption);
  EXPECT_NE(other_sum.status().message().find("published '" + name + "': its checksum differs"), std::string::npos)
      << other_sum.status().ToString();
  auto other_length = client.FetchPublished(server_->address(), name, bytes.size() - 1, sum);
  EXPECT_EQ(other_length.status().code(), Code::kCorruption) << other_length.status().ToString();
  EXPECT_EQ(PeerClient(ClientOptions("wrong-token-of-32-bytes-abcdefgh"))
                .FetchPublished(server_->address(), name, bytes.size(), sum)
                .status()
                .code(),
            Code::kPermissionDenied);
  const std::string bearer = "Bearer " + std::string(kToken);
  EXPECT_EQ(RawGet("/v1/published", bearer).first, 400);
  EXPECT_EQ(RawGet("/v1/published?name=a&name=b", bearer).first, 400);
  EXPECT_EQ(RawGet("/v1/published?name=a", "").first, 401);
  server_->Withdraw(name);
  EXPECT_EQ(server_->Published(name), nullptr);
  EXPECT_EQ(client.FetchPublished(server_->address(), name, bytes.size(), sum).status().code(), Code::kNotFound);
}

TEST_F(PeerDataPlane, StopIsCleanAndClientsSeeAClearError) {
  const PeerAddress a = server_->address();
  server_->Stop();
  server_->Stop();  // idempotent
  PeerClientOptions o = ClientOptions();
  o.timeout = std::chrono::seconds(3);
  o.attempts = 2;
  std::string got(16, '\0');
  Status s = PeerClient(o).ReadShardRange(a, *big_, 0, 16, got.data());
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find(a.ToString()), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(big_->tensor), std::string::npos) << s.ToString();
  // The port is free again.
  PeerServerOptions again;
  again.token = kToken;
  again.port = a.port;
  auto server = PeerServer::Start(store_.get(), again);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE(PeerClient(ClientOptions()).ReadShardRange(a, *big_, 0, 16, got.data()).ok());
  // A second server on the same port fails, naming it.
  auto clash = PeerServer::Start(store_.get(), again);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), Code::kIOError);
  EXPECT_NE(clash.status().message().find(a.ToString()), std::string::npos) << clash.status().ToString();
}

// A peer that takes the connection and then sends nothing (its link cut
// mid-transfer: no reset ever comes) fails each attempt after `stall`, long
// before the deadline, naming the silence.
TEST_F(PeerDataPlane, ASilentPeerFailsAfterTheStallNotTheDeadline) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);  // the kernel accepts; nobody ever answers
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  PeerClientOptions o = ClientOptions();
  o.timeout = std::chrono::seconds(30);
  o.stall = std::chrono::milliseconds(200);
  o.attempts = 2;
  std::vector<char> buf(16);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = PeerClient(o).ReadShardRange({"127.0.0.1", ntohs(a.sin_port)}, *big_, 0, buf.size(), buf.data());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(listener);
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("nothing from the peer for 200 ms"), std::string::npos) << s.ToString();
  EXPECT_LT(seconds, 5.0) << s.ToString();
}

TEST_F(PeerDataPlane, StartRefusesBadOptions) {
  PeerServerOptions o;
  o.token = "short";
  EXPECT_EQ(PeerServer::Start(store_.get(), o).status().code(), Code::kInvalidArgument);
  o.token = kToken;
  o.threads = 0;
  EXPECT_EQ(PeerServer::Start(store_.get(), o).status().code(), Code::kInvalidArgument);
  PeerClientOptions c = ClientOptions();
  c.max_request_bytes = kChecksumBlockBytes + 1;
  std::string got(16, '\0');
  EXPECT_EQ(PeerClient(c).ReadShardRange(server_->address(), *big_, 0, 16, got.data()).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ptc::cluster
