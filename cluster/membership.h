// A job's live workers, kept in etcd by leases (docs/cluster.md):
//
//   MemberKey(JOB, W)   {"worker": W, "address": "HOST:PORT"}   attached to W's lease (keys.h)
//
// A worker daemon joins with a lease of a few seconds and renews it on a
// thread of its own; when the daemon dies its renewals stop, the lease
// expires and etcd deletes the key: the members listed are the live ones.
// Joining is one transaction that requires the key absent, so two daemons
// never hold the same worker index.
//
// Thread safety: the free functions and Membership's methods may be called
// from any thread. The KvStore must outlive the Membership.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cluster/keys.h"  // MembersPrefix, MemberKey
#include "cluster/kv_store.h"
#include "ptc/base/mutex.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

struct Member {
  int worker = 0;
  std::string address;  // the worker's PeerServer, HOST:PORT
  friend bool operator==(const Member&, const Member&) = default;
};

// \error InvalidArgument naming the job unless it is 1-128 bytes of [A-Za-z0-9._-].
Status ValidateJobName(std::string_view job);
// {"worker":W,"address":"HOST:PORT"}.
std::string EncodeMember(const Member& m);
// \error Corruption naming `where` when the value is not such a record.
Result<Member> DecodeMember(std::string_view where, std::string_view value);

// The job's live members, by worker; `revision`, when given, gets etcd's
// revision of the read.
// \error InvalidArgument from ValidateJobName; as KvStore::GetPrefix;
//        Corruption naming the key of a record that cannot be decoded or
//        whose worker differs from its key's.
Result<std::vector<Member>> ListMembers(const KvStore& etcd, std::string_view job, int64_t* revision = nullptr);

struct MembershipOptions {
  std::string job;
  int worker = 0;
  std::string address;       // HOST:PORT of this worker's PeerServer
  int64_t ttl_seconds = 10;  // the lease; renewed every ttl/3
};

class Membership {
 public:
  // Grants a lease, creates this worker's key under it (if absent, and if
  // every comparison of `only_if` holds: a worker that rejoins, cluster/rejoin.h;
  // in one transaction) and starts renewing the lease.
  // \error InvalidArgument for a bad job name, worker < 0, an address that is
  //        not HOST:PORT, ttl_seconds < 1.
  // \error AlreadyExists naming the worker and the holder's address when a
  //        live member holds the worker index (the lease granted is revoked).
  // \error FailedPrecondition when the key is absent but a comparison of
  //        `only_if` failed (the lease granted is revoked).
  // \error as KvStore (IOError when etcd cannot be reached).
  static Result<std::unique_ptr<Membership>> Join(const KvStore* etcd, MembershipOptions options,
                                                  const std::vector<Compare>& only_if = {});
  // Leave(), its error ignored.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Stops renewing and revokes the lease: the key is deleted at once.
  // Idempotent (later calls return OK).
  // \error as KvStore::RevokeLease (NotFound when the lease was lost already).
  Status Leave() EXCLUDES(mu_);

  // OK while the lease is renewed. NotFound once etcd says it expired or was
  // revoked: that stays so, and the daemon must Join again. IOError while no
  // renewal succeeded for a whole TTL (etcd, or the link to it, away): the
  // renewals go on, and the first that succeeds makes it OK again (an etcd
  // that starts again on its data renews every lease it holds).
  Status health() const EXCLUDES(mu_);

  int64_t lease() const { return lease_; }
  const MembershipOptions& options() const { return options_; }
  // ListMembers of this job.
  Result<std::vector<Member>> Members(int64_t* revision = nullptr) const {
    return ListMembers(*etcd_, options_.job, revision);
  }

 private:
  class Stop;
  Membership(const KvStore* etcd, MembershipOptions options, int64_t lease);
  void KeepAlive() EXCLUDES(mu_);

  const KvStore* const etcd_;
  const MembershipOptions options_;
  const int64_t lease_;
  std::unique_ptr<Stop> stop_;
  std::thread thread_;
  mutable Mutex mu_;
  Status health_ GUARDED_BY(mu_);
  bool left_ GUARDED_BY(mu_) = false;
};

}  // namespace ptc::cluster
