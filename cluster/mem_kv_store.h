// An in-memory KvStore (kv_store.h) for tests of everything above the seam:
// etcd's semantics for keys, revisions, prefix ranges, transactions, leases
// and watches, deterministic (a lease expires only when told to), with
// faults injected on demand:
//
//   MemKv kv;                         // the store: what etcd holds
//   auto a = kv.Connect();            // one client of it (a worker's link)
//   a->Cut(true);                     // that link is cut: its calls fail (IOError)
//   a->LoseAnswers(1);                // its next write is applied, its answer lost (IOError)
//   kv.SetReachable(false);           // the store away for every client (leases kept)
//   kv.ExpireLease(id);               // the lease's TTL passed: its keys are deleted
//
// Thread safety: every method may be called from any thread; clients and the
// store may be used concurrently. The MemKv must outlive its clients.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cluster/kv_store.h"
#include "ptc/base/mutex.h"

namespace ptc::cluster {

class MemKvClient;

class MemKv {
 public:
  MemKv();
  ~MemKv();
  MemKv(const MemKv&) = delete;
  MemKv& operator=(const MemKv&) = delete;

  // A new client of this store, with faults of its own.
  std::unique_ptr<MemKvClient> Connect();

  // Whether any client reaches the store (false: etcd stopped; its data and
  // leases stay, and a lease is renewed again once it is back).
  void SetReachable(bool reachable) { reachable_ = reachable; }
  bool reachable() const { return reachable_; }

  // As if `lease`'s TTL passed without a renewal: the lease ends and every key
  // attached to it is deleted (one revision). False when there is no such lease.
  bool ExpireLease(int64_t lease) EXCLUDES(mu_);
  // The store's revision now.
  int64_t revision() const EXCLUDES(mu_);

 private:
  friend class MemKvClient;
  struct LeaseState {
    int64_t ttl = 0;
  };

  // The operations, under mu_, without faults (MemKvClient adds them).
  Status CheckLease(int64_t lease) const REQUIRES(mu_);
  void PutLocked(std::string_view key, std::string_view value, int64_t lease) REQUIRES(mu_);
  int64_t DeleteLocked(std::string_view key, bool prefix) REQUIRES(mu_);
  bool Holds(const Compare& c) const REQUIRES(mu_);
  // Ends a write of one revision: keys changed in it are logged for watches.
  void Written() REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar changed_{&mu_};
  std::map<std::string, KeyValue, std::less<>> keys_ GUARDED_BY(mu_);
  std::map<int64_t, LeaseState> leases_ GUARDED_BY(mu_);
  int64_t revision_ GUARDED_BY(mu_) = 1;
  int64_t next_lease_ GUARDED_BY(mu_) = 1000;
  // Keys written or deleted at the revision under way (pending_) and at each
  // revision (log_): what a watch compares its prefix with. The log is never
  // compacted: a test store sees thousands of revisions, not millions.
  std::vector<std::string> pending_ GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, std::string>> log_ GUARDED_BY(mu_);
  std::atomic<bool> reachable_{true};
};

class MemKvClient final : public KvStore {
 public:
  explicit MemKvClient(MemKv* kv) : kv_(kv) {}

  // This client's link cut (true) or whole again (false).
  void Cut(bool cut) { cut_ = cut; }
  // The next `n` calls that write (puts, deletes, leases, transactions) are
  // applied but answer IOError, as when a connection drops after the request;
  // with `then_cut` the link stays cut after the answer lost (Cut(false) mends it).
  void LoseAnswers(int n, bool then_cut = false) {
    cut_after_loss_ = then_cut;
    lose_ = n;
  }

  Status Health() const override;
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0) const override;
  Result<std::optional<KeyValue>> Get(std::string_view key) const override;
  Result<RangeResponse> GetPrefix(std::string_view prefix) const override;
  Result<int64_t> Delete(std::string_view key) const override;
  Result<int64_t> DeletePrefix(std::string_view prefix) const override;
  Result<Lease> GrantLease(int64_t ttl_seconds) const override;
  Result<int64_t> KeepAliveOnce(int64_t lease) const override;
  Result<int64_t> LeaseTimeToLive(int64_t lease) const override;
  Status RevokeLease(int64_t lease) const override;
  Result<TxnResponse> Txn(const TxnRequest& txn) const override;
  Result<bool> WaitForChange(std::string_view prefix, int64_t revision,
                             std::chrono::milliseconds timeout) const override;

 private:
  // IOError naming the call and key when this client cannot reach the store.
  Status Reach(std::string_view what, std::string_view key) const;
  // After a write was applied: IOError when its answer is to be lost.
  Status Answer(std::string_view what, std::string_view key) const;

  MemKv* const kv_;
  mutable std::atomic<bool> cut_{false};
  mutable std::atomic<int> lose_{0};
  std::atomic<bool> cut_after_loss_{false};
};

}  // namespace ptc::cluster
