// EtcdClient and Membership against a real etcd (Debian etcd-server), started
// by the suite on free loopback ports with a data directory of its own, and
// killed at the end (also when the test process dies: PR_SET_PDEATHSIG).
// Without etcd installed the tests skip; under CI=true they fail instead.
// PTCFS_ETCD names another etcd binary.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cluster/coordinator.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/rejoin.h"
#include "kv_conformance.h"
#include "net_util.h"
#include "test_util.h"

namespace ptc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Eventually;
using testing::FreePort;
using testing::Piece;
using testing::TempDir;

// The etcd binary: $PTCFS_ETCD, else `etcd` on PATH; "" when there is none.
std::string FindEtcd() {
  if (const char* e = std::getenv("PTCFS_ETCD"); e != nullptr && *e != '\0') return e;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/etcd";
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// One etcd server for the suite.
class EtcdProcess {
 public:
  ~EtcdProcess() { Kill(); }

  Status Start(const std::string& binary) {
    const int client = FreePort(), peer = FreePort();
    if (client == 0 || peer == 0 || client == peer) return IOError("no free port");
    binary_ = binary;
    endpoint_ = "127.0.0.1:" + std::to_string(client);
    peer_url_ = "http://127.0.0.1:" + std::to_string(peer);
    log_ = dir_ / "etcd.log";
    return Launch();
  }

  // Starts it again after Kill, on its data and ports.
  Status Restart() { return Launch(); }

  void Kill(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  const std::string& endpoint() const { return endpoint_; }
  // SIGSTOP: etcd stops answering (as behind a cut link); SIGCONT: it answers again.
  void Signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }

 private:
  Status Launch() {
    const std::string& binary = binary_;
    const std::string client_url = "http://" + endpoint_;
    const std::string& peer_url = peer_url_;
    std::vector<std::string> args = {
        binary, "--name=ptcfs-test", "--data-dir=" + (dir_ / "data"), "--listen-client-urls=" + client_url,
        "--advertise-client-urls=" + client_url, "--listen-peer-urls=" + peer_url,
        "--initial-advertise-peer-urls=" + peer_url, "--initial-cluster=ptcfs-test=" + peer_url,
        // Fast elections: leases of 1 s are granted as asked.
        "--heartbeat-interval=10", "--election-timeout=100", "--logger=zap", "--log-level=warn"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return ErrnoError("fork", errno);
    if (pid_ == 0) {
      // Dies with the test process, whatever kills it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    EtcdOptions o;
    o.endpoints = {endpoint_};
    o.timeout = std::chrono::milliseconds(500);
    auto client_or = EtcdClient::Create(o);
    if (!client_or.ok()) return client_or.status();
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(20);
    Status health;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return IOError(binary + " exited (status " + std::to_string(status) + "): " + testing::Slurp(log_));
      }
      health = (*client_or)->Health();
      if (health.ok()) return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return IOError(binary + " not healthy after 20 s: " + health.ToString() + "\n" + testing::Slurp(log_));
  }

  TempDir dir_;  // removed after Kill (members destroyed after the destructor's body)
  std::string binary_;
  std::string endpoint_;  // the client's HOST:PORT
  std::string peer_url_;
  std::string log_;
  pid_t pid_ = -1;
};

class Etcd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string binary = FindEtcd();
    if (binary.empty()) {
      missing_ = true;
      problem_ = "etcd is not installed (apt-get install etcd-server, or set PTCFS_ETCD)";
      return;
    }
    etcd_ = new EtcdProcess();
    Status s = etcd_->Start(binary);
    if (!s.ok()) problem_ = "cannot start etcd: " + s.ToString();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }

  void SetUp() override {
    if (missing_ && !testing::InCi()) GTEST_SKIP() << problem_;
    ASSERT_TRUE(problem_.empty()) << problem_ << (testing::InCi() ? " (CI=true: the cluster tests need etcd)" : "");
    EtcdOptions o;
    o.endpoints = {etcd_->endpoint()};
    auto client = EtcdClient::Create(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    // Keys of this test only.
    prefix_ = std::string("/test/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }

  static inline EtcdProcess* etcd_ = nullptr;
  static inline bool missing_ = false;
  static inline std::string problem_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};

TEST_F(Etcd, PutGetPrefixDelete) { testing::CheckPutGetPrefixDelete(*client_, prefix_); }

TEST_F(Etcd, TransactionsCompareAndSwap) { testing::CheckTransactionsCompareAndSwap(*client_, prefix_); }

TEST_F(Etcd, WaitForChangeWakesOnAWriteUnderThePrefixOnly) { testing::CheckWaitForChangeWakesOnAWriteUnderThePrefixOnly(*client_, prefix_); }

TEST_F(Etcd, LeasesKeepAliveRevokeAndExpire) { testing::CheckLeasesKeepAliveRevokeAndExpire(*client_, prefix_, [](int64_t) {}); }

TEST_F(Etcd, MembersSeeEachOtherAndLeave) {
  const std::string job = "job-" + std::to_string(getpid());
  auto w0 = Membership::Join(client_.get(), {job, 0, "127.0.0.1:9000", 2});
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  auto w1 = Membership::Join(client_.get(), {job, 1, "127.0.0.1:9001", 2});
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  const std::vector<Member> both = {{0, "127.0.0.1:9000"}, {1, "127.0.0.1:9001"}};
  EXPECT_EQ(*(*w0)->Members(), both);
  EXPECT_EQ(*(*w1)->Members(), both);
  // Worker 1 is held: a second daemon for it is refused, naming the holder.
  auto dup = Membership::Join(client_.get(), {job, 1, "127.0.0.1:9999", 2});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), Code::kAlreadyExists);
  EXPECT_NE(dup.status().message().find("127.0.0.1:9001"), std::string::npos) << dup.status().ToString();
  // Renewals keep members past their TTL.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_TRUE((*w0)->health().ok()) << (*w0)->health().ToString();
  EXPECT_EQ(ListMembers(*client_, job)->size(), 2u);
  // Leaving removes the key at once.
  ASSERT_TRUE((*w1)->Leave().ok());
  EXPECT_TRUE((*w1)->Leave().ok());  // idempotent
  EXPECT_EQ(*(*w0)->Members(), std::vector<Member>({{0, "127.0.0.1:9000"}}));
  // The index is free again.
  auto again = Membership::Join(client_.get(), {job, 1, "127.0.0.1:9002", 2});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  again->reset();  // the destructor leaves too
  EXPECT_EQ(ListMembers(*client_, job)->size(), 1u);
  EXPECT_EQ(Membership::Join(client_.get(), {"bad/job", 0, "127.0.0.1:1", 2}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Membership::Join(client_.get(), {job, 2, "no-port", 2}).status().code(), Code::kInvalidArgument);
}

// etcd killed and started again on its data renews every lease as it starts:
// a member whose renewals failed meanwhile (IOError) is a member again, and
// its key stays.
TEST_F(Etcd, AMemberOutlivesARestartOfEtcd) {
  const std::string job = "restart-" + std::to_string(getpid());
  auto m = Membership::Join(client_.get(), {job, 0, "127.0.0.1:9000", 1});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  etcd_->Kill(SIGKILL);
  EXPECT_TRUE(Eventually([&] { return (*m)->health().code() == Code::kIOError; }, std::chrono::seconds(5)))
      << (*m)->health().ToString();
  EXPECT_NE((*m)->health().message().find("no renewal for 1 s"), std::string::npos) << (*m)->health().ToString();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // away for longer than the lease
  ASSERT_TRUE(etcd_->Restart().ok());
  EXPECT_TRUE(Eventually([&] { return (*m)->health().ok(); }, std::chrono::seconds(5))) << (*m)->health().ToString();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the renewed lease is kept renewed
  EXPECT_TRUE((*m)->health().ok()) << (*m)->health().ToString();
  EXPECT_EQ(*(*m)->Members(), std::vector<Member>({{0, "127.0.0.1:9000"}}));
  EXPECT_TRUE((*m)->Leave().ok());
}

TEST_F(Etcd, LeaseExpiryRemovesADeadMember) {
  const std::string job = "dead-" + std::to_string(getpid());
  auto live = Membership::Join(client_.get(), {job, 0, "127.0.0.1:9000", 1});
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  // What a daemon killed leaves behind: its key on a lease nobody renews.
  auto lease = client_->GrantLease(1);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put(MemberKey(job, 1), EncodeMember({1, "127.0.0.1:9001"}), lease->id).ok());
  EXPECT_EQ(ListMembers(*client_, job)->size(), 2u);
  EXPECT_TRUE(Eventually([&] { return ListMembers(*client_, job)->size() == 1; }, std::chrono::seconds(6)));
  EXPECT_EQ(ListMembers(*client_, job)->front().worker, 0);  // the renewed one stays
  EXPECT_TRUE((*live)->health().ok());
  // A member whose lease is revoked behind its back notices and reports it.
  ASSERT_TRUE(client_->RevokeLease((*live)->lease()).ok());
  EXPECT_TRUE(Eventually([&] { return !(*live)->health().ok(); }, std::chrono::seconds(5)));
  EXPECT_EQ((*live)->health().code(), Code::kNotFound) << (*live)->health().ToString();
  EXPECT_TRUE(ListMembers(*client_, job)->empty());
  EXPECT_EQ((*live)->Leave().code(), Code::kNotFound);
}

// A worker whose lease was lost (its link was cut) joins again only while the
// job is where it caught up with it (RejoinConditions: the committed state it
// read, no change under way); otherwise nothing is left behind.
TEST_F(Etcd, RejoinsOnlyWhileTheJobIsWhereItCaughtUp) {
  const std::string job = "rejoin-" + std::to_string(getpid());
  const std::string committed = EncodeCommitted({3, "tp=1,pp=1", "abc", "abc"});
  ASSERT_TRUE(client_->Put(CommittedKey(job), committed).ok());
  const MembershipOptions options{job, 2, "127.0.0.1:9002", 2};
  const std::vector<Compare> conditions = RejoinConditions(job, committed);
  // A change under way: refused (FailedPrecondition, not AlreadyExists), no key left.
  ASSERT_TRUE(client_->Put(ChangeKey(job), "{}").ok());
  auto refused = Membership::Join(client_.get(), options, conditions);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_TRUE(ListMembers(*client_, job)->empty());
  ASSERT_TRUE(client_->Delete(ChangeKey(job)).ok());
  // The job committed another generation since: refused.
  ASSERT_TRUE(client_->Put(CommittedKey(job), EncodeCommitted({4, "tp=1,pp=1", "def", "abc"})).ok());
  EXPECT_EQ(Membership::Join(client_.get(), options, conditions).status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(ListMembers(*client_, job)->empty());
  // Where it caught up, nothing under way: it is a member again.
  ASSERT_TRUE(client_->Put(CommittedKey(job), committed).ok());
  auto joined = Membership::Join(client_.get(), options, conditions);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(*(*joined)->Members(), std::vector<Member>({{2, "127.0.0.1:9002"}}));
  // The key held: a second daemon for the worker is still AlreadyExists.
  EXPECT_EQ(Membership::Join(client_.get(), options, conditions).status().code(), Code::kAlreadyExists);
}

// The reconfiguration protocol (coordinator.h) between three workers of one
// job: one change at a time; every part published, then one commit with the
// same digest everywhere; a failed worker or one that left aborts the change
// on every worker, with nothing committed.
TEST_F(Etcd, CoordinatorCommitsWhenAllAreDoneAndAbortsOtherwise) {
  const std::string job = "coord-" + std::to_string(getpid());
  testing::CheckCoordinatorProtocol(*client_, job);
}

// A part larger than an etcd value may be goes in chunks (job_state.h CutPart).
TEST_F(Etcd, CoordinatorCutsLargeParts) {
  testing::CheckCoordinatorCutsLargeParts(*client_, "chunks-" + std::to_string(getpid()));
}

// A participant that cannot reach etcd while it waits for the commit (its
// link cut) keeps its part and tries again: the job commits the part
// meanwhile, and once etcd answers it gets the others' pieces, not an error.
TEST_F(Etcd, FinishOutlivesEtcdOutOfReach) {
  const std::string job = "cut-" + std::to_string(getpid());
  GenerationManifest current;
  current.generation = 1;
  current.config = "tp=2,pp=1,per_worker=1";
  current.tensors = {{"t", DType::kF32, {8}}};
  current.shards = {Piece(0, 0)};
  current.shards[0].file = "gen-000001/worker-00/t.s0.h5";
  std::vector<std::unique_ptr<Membership>> members;
  std::vector<std::unique_ptr<Coordinator>> workers;
  EtcdOptions quick;  // worker 0's client gives up on a call after 300 ms
  quick.endpoints = {etcd_->endpoint()};
  quick.timeout = std::chrono::milliseconds(300);
  auto quick_client = EtcdClient::Create(quick);
  ASSERT_TRUE(quick_client.ok()) << quick_client.status().ToString();
  for (int w = 0; w < 2; ++w) {
    auto m = Membership::Join(client_.get(), {job, w, "127.0.0.1:" + std::to_string(9200 + w), 10});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    members.push_back(std::move(*m));
    CoordinatorOptions o;
    o.job = job;
    o.worker = w;
    o.poll = std::chrono::milliseconds(50);
    o.timeout = std::chrono::seconds(20);
    workers.push_back(std::make_unique<Coordinator>(w == 0 ? quick_client->get() : client_.get(), o));
    ASSERT_TRUE(workers.back()->Join(current).ok());
  }
  auto change = workers[1]->Propose("tp=2", 1, {0, 1}, {0, 1});
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  Result<std::vector<ShardRecord>> got = InternalError("not run");
  std::thread first([&] { got = workers[0]->Finish(*change, "tp=2", {Piece(0, 1)}, current.shards, current.tensors); });
  ASSERT_TRUE(Eventually([&] { return client_->Get(PartKey(job, 2, 0)).value().has_value(); },
                         std::chrono::seconds(5)));
  // etcd stops answering for longer than several of worker 0's calls.
  etcd_->Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  etcd_->Signal(SIGCONT);
  auto second = workers[1]->Finish(*change, "tp=2", {Piece(1, 2)}, current.shards, current.tensors);
  first.join();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ(got->front().worker, 1);
  EXPECT_EQ((*workers[0]->GetCommitted())->generation, 2u);
}

TEST_F(Etcd, UnreachableEndpointIsAClearError) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(FreePort())};
  o.timeout = std::chrono::milliseconds(1500);
  o.attempts = 2;
  auto client = EtcdClient::Create(o);
  ASSERT_TRUE(client.ok());
  const Clock::time_point start = Clock::now();
  auto r = (*client)->Get("/x");
  EXPECT_EQ(r.status().code(), Code::kIOError);
  EXPECT_NE(r.status().message().find(o.endpoints[0]), std::string::npos) << r.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE((*client)->Health().ok());
  auto watch = (*client)->WaitForChange("/x", 1, std::chrono::seconds(30));
  EXPECT_EQ(watch.status().code(), Code::kIOError);
  EXPECT_NE(watch.status().message().find("watch '/x'"), std::string::npos) << watch.status().ToString();
  EXPECT_EQ(EtcdClient::Create({{}, o.timeout, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({{"nohost"}, o.timeout, 1}).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ptc::cluster
