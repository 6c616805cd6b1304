// The key-value seam (cluster/kv_store.h): MemKv keeps etcd's semantics (the
// checks cluster_etcd_test runs against a real etcd), injects its faults, and
// the coordinator's protocol holds over it, faults included. The commit rule
// (cluster/commit_rule.h) row by row.
#include <gtest/gtest.h>

#include <thread>

#include "cluster/commit_rule.h"
#include "cluster/coordinator.h"
#include "cluster/mem_kv_store.h"
#include "cluster/membership.h"
#include "kv_conformance.h"

namespace ptc::cluster {
namespace {

using testing::Piece;

class MemKvTest : public ::testing::Test {
 protected:
  // Workers 0 and 1 of a job at generation 1 (tp=2), each over a link of its
  // own (declared first: the workers and members go before their links).
  struct TwoWorkers {
    std::vector<std::unique_ptr<MemKvClient>> links;
    std::vector<std::unique_ptr<Membership>> members;
    std::vector<std::unique_ptr<Coordinator>> workers;
    GenerationManifest current;
  };

  void JoinTwo(const std::string& job) {
    two_.current.generation = 1;
    two_.current.config = "tp=2,pp=1,per_worker=1";
    two_.current.tensors = {{"t", DType::kF32, {8}}};
    two_.current.shards = {Piece(0, 0)};
    for (int w = 0; w < 2; ++w) two_.links.push_back(kv_.Connect());
    auto joined = testing::JoinTestWorkers({two_.links[0].get(), two_.links[1].get()}, job, two_.current, 30);
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    two_.members = std::move(joined->members);
    two_.workers = std::move(joined->workers);
  }

  MemKv kv_;
  std::unique_ptr<MemKvClient> client_ = kv_.Connect();
  TwoWorkers two_;
};

TEST_F(MemKvTest, PutGetPrefixDelete) { testing::CheckPutGetPrefixDelete(*client_, "/test/a/"); }
TEST_F(MemKvTest, TransactionsCompareAndSwap) { testing::CheckTransactionsCompareAndSwap(*client_, "/test/b/"); }
TEST_F(MemKvTest, WaitForChangeWakesOnAWriteUnderThePrefixOnly) {
  testing::CheckWaitForChangeWakesOnAWriteUnderThePrefixOnly(*client_, "/test/c/");
}
TEST_F(MemKvTest, LeasesKeepAliveRevokeAndExpire) {
  testing::CheckLeasesKeepAliveRevokeAndExpire(*client_, "/test/d/",
                                               [&](int64_t lease) { EXPECT_TRUE(kv_.ExpireLease(lease)); });
}
TEST_F(MemKvTest, CoordinatorProtocol) { testing::CheckCoordinatorProtocol(*client_, "coord"); }
TEST_F(MemKvTest, CoordinatorCutsLargeParts) { testing::CheckCoordinatorCutsLargeParts(*client_, "cut"); }

TEST_F(MemKvTest, ACutLinkOrAStoreAwayIsAnIOErrorAndLosesNothing) {
  auto other = kv_.Connect();
  ASSERT_TRUE(client_->Put("/k", "1").ok());
  client_->Cut(true);
  for (const Status& s : {client_->Put("/k", "2").status(), client_->Get("/k").status(), client_->Health(),
                          client_->WaitForChange("/", 0, std::chrono::seconds(5)).status()}) {
    EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
    EXPECT_NE(s.message().find("unreachable"), std::string::npos) << s.ToString();
  }
  EXPECT_EQ((*other->Get("/k"))->value, "1");  // the other client's link is whole
  client_->Cut(false);
  EXPECT_EQ((*client_->Get("/k"))->value, "1");
  // The store away: every client fails, leases stay and renew once it is back.
  auto lease = client_->GrantLease(3);
  ASSERT_TRUE(lease.ok());
  kv_.SetReachable(false);
  EXPECT_EQ(other->KeepAliveOnce(lease->id).status().code(), Code::kIOError);
  kv_.SetReachable(true);
  EXPECT_EQ(*other->KeepAliveOnce(lease->id), 3);
}

TEST_F(MemKvTest, ALostAnswerWasApplied) {
  client_->LoseAnswers(1);
  TxnRequest txn;
  txn.compare = {Compare::Absent("/k")};
  txn.success = {TxnOp::Put("/k", "v")};
  auto lost = client_->Txn(txn);
  EXPECT_EQ(lost.status().code(), Code::kIOError);
  EXPECT_NE(lost.status().message().find("answer lost"), std::string::npos) << lost.status().ToString();
  EXPECT_EQ((*client_->Get("/k"))->value, "v");  // applied
  EXPECT_FALSE(client_->Txn(txn)->succeeded);     // a retry sees it
}

// A participant whose link drops right after it published its part (the
// answer lost, the link cut) keeps its part and tries again: the job commits
// meanwhile, and once it reaches the store again its retry finds the change
// gone, the generation committed with its part, and it gets the others' pieces.
TEST_F(MemKvTest, FinishOutlivesALostAnswerAndACutLink) {
  const std::string job = "cut";
  ASSERT_NO_FATAL_FAILURE(JoinTwo(job));
  auto& links = two_.links;
  auto& workers = two_.workers;
  const GenerationManifest& current = two_.current;
  auto change = workers[1]->Propose("tp=2", 1, {0, 1}, {0, 1});
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  links[0]->LoseAnswers(1, /*then_cut=*/true);
  Result<std::vector<ShardRecord>> got = InternalError("not run");
  std::thread first([&] { got = workers[0]->Finish(*change, "tp=2", {Piece(0, 1)}, current.shards, current.tensors); });
  ASSERT_TRUE(testing::Eventually([&] { return client_->Get(PartKey(job, 2, 0)).value().has_value(); },
                                  std::chrono::seconds(5)));
  auto second = workers[1]->Finish(*change, "tp=2", {Piece(1, 2)}, current.shards, current.tensors);
  ASSERT_TRUE(second.ok()) << second.status().ToString();  // committed while worker 0 is cut off
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  links[0]->Cut(false);
  first.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ(got->front().worker, 1);
  EXPECT_EQ((*workers[0]->GetCommitted())->generation, 2u);
}

// A participant whose lease expires mid-change (a worker killed: no renewal,
// no Fail) aborts the change on the others, naming it.
TEST_F(MemKvTest, ALeaseExpiringMidChangeAbortsIt) {
  ASSERT_NO_FATAL_FAILURE(JoinTwo("lost"));
  auto& links = two_.links;
  auto& members = two_.members;
  auto& workers = two_.workers;
  const GenerationManifest& current = two_.current;
  auto change = workers[0]->Propose("tp=2", 1, {0, 1}, {0, 1});
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  links[1]->Cut(true);  // worker 1 dies: it renews nothing more
  Result<std::vector<ShardRecord>> got = InternalError("not run");
  std::thread first([&] { got = workers[0]->Finish(*change, "tp=2", {Piece(0, 1)}, current.shards, current.tensors); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(kv_.ExpireLease(members[1]->lease()));
  first.join();
  EXPECT_EQ(got.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("worker 1 left the job (its lease expired)"), std::string::npos)
      << got.status().ToString();
  EXPECT_EQ((*workers[0]->GetCommitted())->generation, 1u);
  EXPECT_FALSE(*workers[0]->Pending());
}

// The commit rule, one row per outcome (docs/cluster.md).
TEST(CommitRule, EveryRow) {
  const Change change{"w0-1", 4, 5, "tp=3", {0, 1, 2}};
  auto round = [](std::set<int> parts, bool stands, uint64_t committed, bool digest, std::vector<int> members,
                  bool late) {
    return FinishRound{std::move(parts), stands, committed, digest, std::move(members), late,
                       std::chrono::milliseconds(600000), std::nullopt};
  };
  struct Row {
    const char* what;
    FinishRound round;
    FinishDecision want;
  };
  const std::vector<Row> rows = {
      {"committed with every part, same pieces", round({0, 1, 2}, false, 5, true, {0, 1, 2}, false),
       {FinishAction::kDone, ""}},
      {"committed with other pieces", round({0, 1, 2}, false, 5, false, {0, 1, 2}, false),
       {FinishAction::kCorrupt, ""}},
      {"committed, a part read before it came", round({0, 2}, false, 5, true, {0, 1, 2}, false),
       {FinishAction::kLookAgain, ""}},
      {"another change's generation committed", round({1, 2}, false, 5, true, {0, 1, 2}, false),
       {FinishAction::kAborted, ""}},
      {"change gone, nothing committed", round({0, 1}, false, 4, false, {0, 1, 2}, false),
       {FinishAction::kAborted, ""}},
      {"every part in", round({0, 1, 2}, true, 4, false, {0, 1, 2}, false), {FinishAction::kCommit, ""}},
      {"every part in, past the deadline", round({0, 1, 2}, true, 4, false, {0, 1, 2}, true),
       {FinishAction::kCommit, ""}},
      {"a participant left", round({0, 2}, true, 4, false, {0, 2}, false),
       {FinishAction::kAbort, "worker 1 left the job (its lease expired)"}},
      {"past the deadline", round({0, 2}, true, 4, false, {0, 1, 2}, true),
       {FinishAction::kAbort, "not every worker finished within 600 s"}},
      {"parts to come", round({0}, true, 4, false, {0, 1, 2, 3}, false), {FinishAction::kWait, ""}},
  };
  for (const Row& row : rows) {
    const FinishDecision got = DecideFinish(change, 0, row.round);
    EXPECT_EQ(static_cast<int>(got.action), static_cast<int>(row.want.action)) << row.what;
    EXPECT_EQ(got.reason, row.want.reason) << row.what;
  }
}

// The settle's outcome is one of the rule's inputs: an error aborts a change
// whose parts are all in, naming it, where it would commit; elsewhere the
// rule decides as without it.
TEST(CommitRule, TheSettlesErrorAbortsInsteadOfACommit) {
  const Change change{"w0-1", 4, 5, "save 3", {0, 1, 2}};
  auto round = [](std::set<int> parts, bool stands, uint64_t committed, std::vector<int> members, bool late,
                  std::optional<std::string> settle_error) {
    const std::chrono::milliseconds timeout(600000);
    return FinishRound{std::move(parts), stands, committed, false, std::move(members), late, timeout,
                       std::move(settle_error)};
  };
  struct Row {
    const char* what;
    FinishRound round;
    FinishDecision want;
  };
  const std::string unsettled = "the saves disagree on the iteration (3 on worker 0, 4 on worker 1)";
  const std::vector<Row> rows = {
      {"every part in, settled",
       round({0, 1, 2}, true, 4, {0, 1, 2}, false, std::nullopt),
       {FinishAction::kCommit, ""}},
      {"every part in, unsettled",
       round({0, 1, 2}, true, 4, {0, 1, 2}, false, unsettled),
       {FinishAction::kAbort, unsettled}},
      {"every part in, unsettled, a worker gone too",
       round({0, 1, 2}, true, 4, {0, 2}, false, unsettled),
       {FinishAction::kAbort, unsettled}},
      {"every part in, unsettled, past the deadline",
       round({0, 1, 2}, true, 4, {0, 1, 2}, true, unsettled),
       {FinishAction::kAbort, unsettled}},
      {"unsettled, but the change is gone",
       round({0, 1, 2}, false, 4, {0, 1, 2}, false, unsettled),
       {FinishAction::kAborted, ""}},
      {"unsettled, committed by another worker",
       round({0, 1, 2}, false, 5, {0, 1, 2}, false, unsettled),
       {FinishAction::kCorrupt, ""}},
  };
  for (const Row& row : rows) {
    const FinishDecision got = DecideFinish(change, 0, row.round);
    EXPECT_EQ(got, row.want) << row.what << ": got action " << static_cast<int>(got.action) << " '" << got.reason
                             << "'";
  }
}

}  // namespace
}  // namespace ptc::cluster
