// What every KvStore (cluster/kv_store.h) does as etcd does: run by
// cluster_etcd_test against a real etcd and by cluster_kv_test against
// MemKv, so the in-memory store the worker tests run on keeps etcd's
// semantics. Each check works under `prefix` and leaves other keys alone.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "cluster/coordinator.h"
#include "cluster/kv_store.h"
#include "cluster/membership.h"
#include "test_util.h"

namespace ptc::testing {

// Polls `done` every 50 ms for up to `limit`; true when it held.
template <typename F>
bool Eventually(F done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

inline void CheckPutGetPrefixDelete(const cluster::KvStore& kv, const std::string& prefix) {
  const std::string binary_key = prefix + std::string("k\0\xff", 3);
  const std::string binary_value("v\0\x01\xfe", 4);
  auto r1 = kv.Put(prefix + "a", "1");
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  auto r2 = kv.Put(binary_key, binary_value);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_GT(*r2, *r1);
  auto a = kv.Get(prefix + "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->mod_revision, *r1);
  EXPECT_EQ((*a)->version, 1);
  auto b = kv.Get(binary_key);
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->value, binary_value);
  auto absent = kv.Get(prefix + "nothing");
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_FALSE(absent->has_value());
  ASSERT_TRUE(kv.Put("/test/outside", "x").ok());
  auto range = kv.GetPrefix(prefix);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  ASSERT_EQ(range->kvs.size(), 2u);  // not /test/outside
  EXPECT_EQ(range->kvs[0].key, prefix + "a");
  EXPECT_EQ(range->kvs[1].key, binary_key);
  EXPECT_GE(range->revision, *r2);
  EXPECT_EQ(*kv.Delete(prefix + "a"), 1);
  EXPECT_EQ(*kv.Delete(prefix + "a"), 0);
  EXPECT_EQ(*kv.DeletePrefix(prefix), 1);
  EXPECT_TRUE(kv.GetPrefix(prefix)->kvs.empty());
}

inline void CheckTransactionsCompareAndSwap(const cluster::KvStore& kv, const std::string& prefix) {
  const std::string key = prefix + "committed";
  // Create only if absent: the first succeeds, the second conflicts.
  cluster::TxnRequest create;
  create.compare = {cluster::Compare::Absent(key)};
  create.success = {cluster::TxnOp::Put(key, "gen=1")};
  auto c1 = kv.Txn(create);
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  EXPECT_TRUE(c1->succeeded);
  auto c2 = kv.Txn(create);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_FALSE(c2->succeeded);
  // Two writers read the same revision; one wins, the other's compare fails
  // and its failure branch runs instead.
  const int64_t read = (*kv.Get(key))->mod_revision;
  cluster::TxnRequest w1;
  w1.compare = {cluster::Compare::ModRevisionIs(key, read)};
  w1.success = {cluster::TxnOp::Put(key, "gen=2"), cluster::TxnOp::Put(prefix + "pending", "none")};
  cluster::TxnRequest w2 = w1;
  w2.success = {cluster::TxnOp::Put(key, "gen=2b")};
  w2.failure = {cluster::TxnOp::Put(prefix + "lost", "w2")};
  auto t1 = kv.Txn(w1);
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();
  EXPECT_TRUE(t1->succeeded);
  auto t2 = kv.Txn(w2);
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  EXPECT_FALSE(t2->succeeded);
  EXPECT_EQ((*kv.Get(key))->value, "gen=2");
  EXPECT_EQ((*kv.Get(prefix + "pending"))->value, "none");  // same transaction
  EXPECT_EQ((*kv.Get(prefix + "pending"))->mod_revision, t1->revision);
  EXPECT_EQ((*kv.Get(prefix + "lost"))->value, "w2");
  // Compare on the value.
  cluster::TxnRequest by_value;
  by_value.compare = {cluster::Compare::ValueIs(key, "gen=2")};
  by_value.success = {cluster::TxnOp::Put(key, "gen=3")};
  EXPECT_TRUE(kv.Txn(by_value)->succeeded);
  EXPECT_FALSE(kv.Txn(by_value)->succeeded);
  EXPECT_EQ((*kv.Get(key))->value, "gen=3");
}

inline void CheckWaitForChangeWakesOnAWriteUnderThePrefixOnly(const cluster::KvStore& kv, const std::string& prefix) {
  using Clock = std::chrono::steady_clock;
  auto start = kv.Put(prefix + "a", "1");
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  // Nothing newer under the prefix: the wait times out, false.
  ASSERT_TRUE(kv.Put("/test/elsewhere", "x").ok());
  const Clock::time_point t0 = Clock::now();
  auto quiet = kv.WaitForChange(prefix, *start, std::chrono::milliseconds(300));
  ASSERT_TRUE(quiet.ok()) << quiet.status().ToString();
  EXPECT_FALSE(*quiet);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(250));
  // A write after the revision, made while waiting: true, long before the timeout.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(kv.Put(prefix + "b", "2").ok());
  });
  const Clock::time_point t1 = Clock::now();
  auto woke = kv.WaitForChange(prefix, *start, std::chrono::seconds(20));
  writer.join();
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_TRUE(*woke);
  EXPECT_LT(Clock::now() - t1, std::chrono::seconds(5));
  // A write already made after the revision wakes at once; so does a delete.
  EXPECT_TRUE(*kv.WaitForChange(prefix, *start, std::chrono::seconds(20)));
  auto after = kv.GetPrefix(prefix);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(*kv.WaitForChange(prefix, after->revision, std::chrono::milliseconds(100)));
  ASSERT_EQ(*kv.Delete(prefix + "a"), 1);
  EXPECT_TRUE(*kv.WaitForChange(prefix, after->revision, std::chrono::seconds(20)));
}

inline void CheckLeasesKeepAliveRevokeAndExpire(const cluster::KvStore& kv, const std::string& prefix,
                                                const std::function<void(int64_t)>& expire) {
  auto lease = kv.GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_GE(lease->ttl, 5);
  ASSERT_TRUE(kv.Put(prefix + "held", "x", lease->id).ok());
  EXPECT_EQ((*kv.Get(prefix + "held"))->lease, lease->id);
  auto ttl = kv.KeepAliveOnce(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GE(*ttl, 1);
  auto left = kv.LeaseTimeToLive(lease->id);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_GE(*left, 1);
  EXPECT_LE(*left, lease->ttl);
  ASSERT_TRUE(kv.RevokeLease(lease->id).ok());
  EXPECT_EQ(*kv.LeaseTimeToLive(lease->id), -1);
  EXPECT_FALSE(kv.Get(prefix + "held")->has_value());  // deleted with the lease
  EXPECT_EQ(kv.KeepAliveOnce(lease->id).status().code(), Code::kNotFound);
  Status again = kv.RevokeLease(lease->id);
  EXPECT_EQ(again.code(), Code::kNotFound) << again.ToString();
  EXPECT_EQ(kv.Put(prefix + "x", "y", lease->id).status().code(), Code::kNotFound);
  EXPECT_EQ(kv.GrantLease(0).status().code(), Code::kInvalidArgument);
  // A lease not renewed expires and takes its keys with it (`expire` makes
  // it so where the store can; etcd's TTL passes on its own).
  auto short_lease = kv.GrantLease(1);
  ASSERT_TRUE(short_lease.ok());
  ASSERT_TRUE(kv.Put(prefix + "short", "x", short_lease->id).ok());
  expire(short_lease->id);
  EXPECT_TRUE(Eventually([&] { return !kv.Get(prefix + "short")->has_value(); }, std::chrono::seconds(6)));
}

// A shard record of tensor "t" (8 f32), element k, on `worker`.
inline ShardRecord Piece(int worker, int k) {
  ShardRecord r;
  r.tensor = "t";
  r.boxes = {Box{{static_cast<Index>(k)}, {static_cast<Index>(k + 1)}}};
  r.worker = worker;
  r.file = "gen-000002/worker-0" + std::to_string(worker) + "/t.s" + std::to_string(k) + ".h5";
  r.offset = 2048;
  r.nbytes = 4;
  r.checksum = 0x1234 + k;
  return r;
}

// Workers 0..links.size()-1 of job `job` at generation `current`, worker w
// over links[w]: a member (a lease of `ttl` seconds) and a coordinator
// (polling every 10 ms, aborting after 20 s) each, joined in order (the first
// sets the committed state, the others agree).
struct TestWorkers {
  std::vector<std::unique_ptr<cluster::Membership>> members;
  std::vector<std::unique_ptr<cluster::Coordinator>> workers;
};
inline Result<TestWorkers> JoinTestWorkers(const std::vector<const cluster::KvStore*>& links, const std::string& job,
                                           const GenerationManifest& current, int64_t ttl,
                                           size_t max_value = cluster::kMaxEtcdValue) {
  TestWorkers t;
  for (size_t w = 0; w < links.size(); ++w) {
    const int worker = static_cast<int>(w);
    PTC_ASSIGN_OR_RETURN(
        auto m, cluster::Membership::Join(links[w], {job, worker, "127.0.0.1:" + std::to_string(9100 + w), ttl}));
    t.members.push_back(std::move(m));
    cluster::CoordinatorOptions o;
    o.job = job;
    o.worker = worker;
    o.poll = std::chrono::milliseconds(10);
    o.timeout = std::chrono::seconds(20);
    o.max_value_bytes = max_value;
    t.workers.push_back(std::make_unique<cluster::Coordinator>(links[w], o));
    PTC_RETURN_IF_ERROR(t.workers.back()->Join(current));
  }
  return t;
}

// The reconfiguration protocol (coordinator.h) between three workers of job `job`.
inline void CheckCoordinatorProtocol(const cluster::KvStore& kv, const std::string& job) {
  GenerationManifest current;
  current.generation = 1;
  current.config = "tp=3,pp=1,per_worker=1";
  current.tensors = {{"t", DType::kF32, {8}}};
  current.shards = {Piece(0, 0)};
  current.shards[0].file = "gen-000001/worker-00/t.s0.h5";
  auto joined = JoinTestWorkers({&kv, &kv, &kv}, job, current, 2);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  auto& [members, workers] = *joined;
  GenerationManifest other = current;
  other.generation = 2;
  EXPECT_EQ(workers[1]->Join(other).code(), Code::kFailedPrecondition);
  // Too few live workers for the config; then a change, and no second one meanwhile.
  EXPECT_EQ(workers[0]->Propose("tp=4", 1, {0, 1, 2}, {0, 1, 2, 3}).status().code(), Code::kInvalidArgument);
  auto change = workers[2]->Propose("tp=3", 1, {2, 0, 1}, {0, 1, 2});
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->workers, std::vector<int>({0, 1, 2}));
  EXPECT_EQ(workers[0]->Propose("tp=3", 1, {0, 1, 2}, {0, 1, 2}).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(*workers[1]->Pending(), std::optional<cluster::Change>(*change));
  // Every worker finishes its part; each gets the others' pieces.
  const std::vector<ShardRecord> referenced = current.shards;
  std::vector<Result<std::vector<ShardRecord>>> got(3, InternalError("not run"));
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w, worker = workers[w].get()] {  // (clang 14 captures no structured binding)
        got[w] = worker->Finish(*change, "tp=3", {Piece(w, w + 1)}, referenced, current.tensors);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(got[w].ok()) << w << ": " << got[w].status().ToString();
    ASSERT_EQ(got[w]->size(), 2u);
    for (const ShardRecord& r : *got[w]) EXPECT_NE(r.worker, w);
  }
  auto committed = workers[0]->GetCommitted();
  ASSERT_TRUE(committed.ok() && *committed);
  EXPECT_EQ((*committed)->generation, 2u);
  EXPECT_EQ((*committed)->digest,
            cluster::PiecesDigest("tp=3", {Piece(2, 3), Piece(0, 1), current.shards[0], Piece(1, 2)}));
  EXPECT_FALSE(*workers[0]->Pending());

  // Worker 1 fails: the others' Finish reports the abort, nothing is committed.
  auto second = workers[0]->Propose("tp=3,per_worker=1", 2, {0, 1, 2}, {0, 1, 2});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  workers[1]->Fail(*second, IOError("disk full"));
  EXPECT_FALSE(*workers[2]->Pending());  // withdrawn by the worker that failed: the next change may come
  auto aborted = workers[0]->Finish(*second, "tp=3", {}, referenced, current.tensors);
  EXPECT_EQ(aborted.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(aborted.status().message().find("worker 1 failed: IOError: disk full"), std::string::npos)
      << aborted.status().ToString();
  auto late = workers[2]->Finish(*second, "tp=3", {}, referenced, current.tensors);  // after the abort
  EXPECT_EQ(late.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ((*workers[0]->GetCommitted())->generation, 2u);
  EXPECT_FALSE(*workers[0]->Pending());

  // Worker 2 leaves during a change: aborted when its lease is gone.
  auto third = workers[0]->Propose("tp=3", 2, {0, 1, 2}, {0, 1, 2});
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(members[2]->Leave().ok());
  auto left = workers[0]->Finish(*third, "tp=3", {}, referenced, current.tensors);
  EXPECT_NE(left.status().message().find("worker 2 left the job"), std::string::npos) << left.status().ToString();
  EXPECT_EQ((*workers[1]->GetCommitted())->generation, 2u);

  // A change whose participants are all gone is withdrawn by whoever sees it.
  auto orphan = workers[0]->Propose("tp=3", 2, {0, 1}, {});
  ASSERT_TRUE(orphan.ok()) << orphan.status().ToString();
  workers[1]->Withdraw(*orphan, "every participant left the job");
  EXPECT_FALSE(*workers[0]->Pending());
  auto gone = workers[0]->Finish(*orphan, "tp=3", {}, referenced, current.tensors);
  EXPECT_NE(gone.status().message().find("every participant left the job"), std::string::npos)
      << gone.status().ToString();
  workers[1]->Withdraw(*orphan, "twice");  // gone already: nothing
  EXPECT_TRUE(workers[0]->Propose("tp=3", 2, {0, 1}, {}).ok());
}

// Parts larger than a value may be (a worker's pieces of a large job) are
// cut into chunks, each at most that size, and every worker gets the others'
// pieces whole.
inline void CheckCoordinatorCutsLargeParts(const cluster::KvStore& kv, const std::string& job) {
  GenerationManifest current;
  current.generation = 1;
  current.config = "tp=2,pp=1,per_worker=1";
  current.tensors = {{"t", DType::kF32, {64}}};
  current.shards = {Piece(0, 0)};
  constexpr size_t kMaxValue = 700;
  auto joined = JoinTestWorkers({&kv, &kv}, job, current, 5, kMaxValue);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  auto& workers = joined->workers;
  auto change = workers[0]->Propose("tp=2", 1, {0, 1}, {0, 1});
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  std::vector<std::vector<ShardRecord>> mine(2);
  for (int w = 0; w < 2; ++w) {
    for (int k = 0; k < 12 + 3 * w; ++k) mine[w].push_back(Piece(w, 10 * (w + 1) + k));
  }
  std::vector<Result<std::vector<ShardRecord>>> got(2, InternalError("not run"));
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w, worker = workers[w].get()] {
        got[w] = worker->Finish(*change, "tp=2", mine[w], current.shards, current.tensors);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(got[w].ok()) << w << ": " << got[w].status().ToString();
    EXPECT_EQ(*got[w], mine[1 - w]) << w;
  }
  auto values = kv.GetPrefix(cluster::PartsPrefix(job, 2));
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  size_t chunks = 0;
  for (const cluster::KeyValue& v : values->kvs) {
    EXPECT_LE(v.value.size(), kMaxValue) << v.key;
    chunks += cluster::PartChunkOf(job, 2, v.key).has_value();
  }
  EXPECT_GE(chunks, 4u);  // both parts cut
}

}  // namespace ptc::testing
