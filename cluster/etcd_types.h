// The values of etcd's v3 KV, lease and transaction API as EtcdClient
// (etcd_client.h) sends and returns them: keys and values are byte strings,
// revisions and lease ids int64 (https://etcd.io/docs/v3.4/learning/api/).
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptc::cluster {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision of the key's creation
  int64_t mod_revision = 0;     // revision of its last change
  int64_t version = 0;          // changes since its creation
  int64_t lease = 0;            // 0: none
  friend bool operator==(const KeyValue&, const KeyValue&) = default;
};

// The keys of a range, and the store's revision when it was read.
struct RangeResponse {
  std::vector<KeyValue> kvs;  // sorted by key
  int64_t revision = 0;
};

// One message of a watch's stream (etcd's WatchResponse), as much as a
// waiter needs: whether anything happened after the watch's start revision.
struct WatchMessage {
  bool created = false;          // the watch's first message: it is set up
  bool canceled = false;         // the watch ended (compacted revision, or etcd's reason)
  int64_t compact_revision = 0;  // > 0: the start revision was compacted away
  size_t events = 0;             // puts and deletes under the watched range
  int64_t revision = 0;          // the header's revision
};

struct Lease {
  int64_t id = 0;
  int64_t ttl = 0;  // seconds
};

// One comparison of a transaction: the key's target <op> the given value. A
// key that does not exist has create_revision, mod_revision and version 0
// (so CreateRevision == 0 asks "absent").
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kModRevision;
  Op op = Op::kEqual;
  int64_t number = 0;  // for the revision and version targets
  std::string value;   // for kValue

  static Compare ModRevisionIs(std::string key, int64_t revision) {
    return {std::move(key), Target::kModRevision, Op::kEqual, revision, ""};
  }
  static Compare Absent(std::string key) { return {std::move(key), Target::kCreateRevision, Op::kEqual, 0, ""}; }
  static Compare ValueIs(std::string key, std::string value) {
    return {std::move(key), Target::kValue, Op::kEqual, 0, std::move(value)};
  }
};

// One write of a transaction's branch.
struct TxnOp {
  enum class Kind { kPut, kDelete, kDeletePrefix };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;  // kPut
  int64_t lease = 0;  // kPut; 0: none

  static TxnOp Put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::kPut, std::move(key), std::move(value), lease};
  }
  static TxnOp Delete(std::string key) { return {Kind::kDelete, std::move(key), "", 0}; }
  static TxnOp DeletePrefix(std::string prefix) { return {Kind::kDeletePrefix, std::move(prefix), "", 0}; }
};

// If every comparison holds, the success writes, else the failure writes:
// all in one revision, atomically.
struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<TxnOp> success;
  std::vector<TxnOp> failure;
};

struct TxnResponse {
  bool succeeded = false;  // the comparisons held
  int64_t revision = 0;    // the store's revision after the transaction
};

}  // namespace ptc::cluster
