// The key-value seam of the cluster layer: what the coordinator, membership
// and the worker agent need of a job's consistent store (keys, prefix ranges,
// compare-and-swap transactions, leases, watch), as etcd's v3 API gives it.
// Implementations: EtcdClient (etcd_client.h, the real one) and MemKvStore
// (mem_kv_store.h: in memory, deterministic, with fault injection), as
// leveldb's Env has its memenv and fault env.
//
// Values: etcd_types.h. Errors follow EtcdClient's: IOError when the store
// cannot be reached or fails (the caller may try again), NotFound for a lease
// that does not exist, Corruption for an answer not understood.
//
// Thread safety: every method may be called from any thread concurrently; a
// KvStore is a handle (the state lives in the store), hence const methods.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "cluster/etcd_types.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // OK when the store answers.
  virtual Status Health() const = 0;

  // Sets key to value (attached to `lease` unless 0); the revision of the write.
  virtual Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0) const = 0;
  // The key, or nullopt when absent.
  virtual Result<std::optional<KeyValue>> Get(std::string_view key) const = 0;
  // Every key starting with `prefix`, sorted, with the revision read.
  virtual Result<RangeResponse> GetPrefix(std::string_view prefix) const = 0;
  // Deletes the key; the number of keys deleted (0 or 1).
  virtual Result<int64_t> Delete(std::string_view key) const = 0;
  // Deletes every key starting with `prefix`; the number deleted.
  virtual Result<int64_t> DeletePrefix(std::string_view prefix) const = 0;

  // A new lease of ttl_seconds (the store may grant more).
  // \error InvalidArgument when ttl_seconds < 1.
  virtual Result<Lease> GrantLease(int64_t ttl_seconds) const = 0;
  // Renews the lease once; the TTL it has now.
  // \error NotFound when the lease expired or was revoked.
  virtual Result<int64_t> KeepAliveOnce(int64_t lease) const = 0;
  // The seconds the lease has left; -1 when it expired or was revoked.
  virtual Result<int64_t> LeaseTimeToLive(int64_t lease) const = 0;
  // Ends the lease: every key attached to it is deleted.
  // \error NotFound when there is no such lease.
  virtual Status RevokeLease(int64_t lease) const = 0;

  // One transaction: if every comparison holds, the success writes, else the
  // failure writes, atomically. A conflict is not an error: succeeded is false.
  // \error NotFound when a put names a lease that does not exist.
  virtual Result<TxnResponse> Txn(const TxnRequest& txn) const = 0;

  // Waits until a key starting with `prefix` is written or deleted at a
  // revision after `revision`, at most `timeout` without one: true when one
  // was (or the store can no longer tell: read again), false when the time
  // passed quietly. So a reader at revision R sleeps until its view may be
  // stale instead of polling.
  // \error IOError when the store cannot be reached (callers fall back to polling).
  virtual Result<bool> WaitForChange(std::string_view prefix, int64_t revision,
                                     std::chrono::milliseconds timeout) const = 0;
};

}  // namespace ptc::cluster
