// A small client of etcd's v3 API through its JSON gateway (etcd 3.4:
// POST http://HOST:PORT/v3/..., etcd_codec.h): keys, prefix ranges, leases
// and compare-and-swap transactions. Enough for membership by leases
// (membership.h) and for making every change of a job's committed state one
// transaction that compares the revision it read.
//
// Every call has a deadline (options.timeout) and a bounded retry: a
// connection that cannot be made is tried again on the next endpoint; a call
// that may have been applied (a write whose answer was lost) is retried only
// when it is a read or a lease keep-alive. Errors name the endpoint, the call
// and the key.
//
// Thread safety: all methods may be called from any thread concurrently
// (each call opens a connection of its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/etcd_types.h"
#include "cluster/kv_store.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

struct EtcdOptions {
  // HOST:PORT of etcd's client URLs (plain http), tried in order.
  std::vector<std::string> endpoints = {"127.0.0.1:2379"};
  std::chrono::milliseconds timeout{5000};  // one call, retries included
  int attempts = 3;                         // rounds over the endpoints
};

class EtcdClient final : public KvStore {
 public:
  // \error InvalidArgument when there is no endpoint, one is not HOST:PORT, or attempts < 1.
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);

  // OK when an endpoint answers GET /health with {"health":"true"}.
  // \error IOError naming the endpoints otherwise.
  Status Health() const override;

  // Sets key to value (attached to `lease` unless 0); the revision of the write.
  // \error NotFound when the lease does not exist; IOError when etcd cannot be reached or fails.
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0) const override;
  // The key, or nullopt when absent.
  // \error IOError when etcd cannot be reached or fails; Corruption for an answer not understood.
  Result<std::optional<KeyValue>> Get(std::string_view key) const override;
  // Every key starting with `prefix`, sorted, with the revision read.
  // \error as Get.
  Result<RangeResponse> GetPrefix(std::string_view prefix) const override;
  // Deletes the key; the number of keys deleted (0 or 1).
  // \error as Get.
  Result<int64_t> Delete(std::string_view key) const override;
  // Deletes every key starting with `prefix`; the number deleted.
  // \error as Get.
  Result<int64_t> DeletePrefix(std::string_view prefix) const override;

  // A new lease of ttl_seconds (etcd may grant more: its minimum TTL).
  // \error InvalidArgument when ttl_seconds < 1; IOError as Get.
  Result<Lease> GrantLease(int64_t ttl_seconds) const override;
  // Renews the lease once; the TTL it has now.
  // \error NotFound when the lease expired or was revoked; IOError as Get.
  Result<int64_t> KeepAliveOnce(int64_t lease) const override;
  // The seconds the lease has left; -1 when it expired or was revoked.
  // \error IOError as Get.
  Result<int64_t> LeaseTimeToLive(int64_t lease) const override;
  // Ends the lease: every key attached to it is deleted.
  // \error NotFound when there is no such lease; IOError as Get.
  Status RevokeLease(int64_t lease) const override;

  // One transaction: if every comparison holds, the success writes, else the
  // failure writes, atomically. A conflict is not an error: succeeded is false.
  // \error NotFound when a put names a lease that does not exist; IOError as Get.
  Result<TxnResponse> Txn(const TxnRequest& txn) const override;

  // Waits (a watch over etcd's gateway) until a key starting with `prefix` is
  // written or deleted at a revision after `revision`, at most `timeout`
  // without a message: true when one was, or when etcd can no longer tell
  // (`revision` compacted: read again); false when the time passed quietly.
  // So a reader at revision R sleeps until its view may be stale instead of
  // polling.
  // \error IOError when no endpoint can be reached or the watch fails
  //        (callers fall back to polling); Corruption for a message not understood.
  Result<bool> WaitForChange(std::string_view prefix, int64_t revision, std::chrono::milliseconds timeout) const override;

  const EtcdOptions& options() const { return options_; }

 private:
  explicit EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
  // POSTs `body` to `path`: the answer's body. `idempotent`: also retried after
  // a failure once connected. `what` names the call in errors.
  Result<std::string> Post(const std::string& path, const std::string& body, bool idempotent,
                           std::string_view what) const;

  EtcdOptions options_;
};

}  // namespace ptc::cluster
