// Membership of a job's workers in etcd, by leases.
#include "cluster/membership.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <nlohmann/json.hpp>

#include "cluster/peer_protocol.h"
#include "ptc/base/json_fields.h"

namespace ptc::cluster {

// Wakes the keep-alive thread to end it. A std::mutex and condition variable:
// ptc::Mutex has no condition variable to wait on; this lock guards only the
// flag, inside this class.
class Membership::Stop {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  // Waits up to `d`; true when stopped.
  bool WaitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [this] { return stop_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

Status ValidateJobName(std::string_view job) {
  const bool ok = !job.empty() && job.size() <= 128 && std::all_of(job.begin(), job.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
  if (!ok || job == "." || job == "..") {
    return InvalidArgumentError("job name '" + std::string(job.substr(0, 128)) +
                                "': must be 1-128 characters of [A-Za-z0-9._-]");
  }
  return Status::OK();
}

std::string EncodeMember(const Member& m) {
  return nlohmann::json{{"worker", m.worker}, {"address", m.address}}.dump();
}

Result<Member> DecodeMember(std::string_view where, std::string_view value) {
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptionError(std::string(where) + ": not a JSON object");
  JsonFields f(j, std::string(where));
  Member m;
  PTC_ASSIGN_OR_RETURN(uint64_t worker, f.Unsigned("worker"));
  if (worker > 1u << 30) return f.Error("worker", "is too large");
  m.worker = static_cast<int>(worker);
  PTC_ASSIGN_OR_RETURN(m.address, f.String("address"));
  return m;
}

Result<std::vector<Member>> ListMembers(const KvStore& etcd, std::string_view job, int64_t* revision) {
  PTC_RETURN_IF_ERROR(ValidateJobName(job));
  PTC_ASSIGN_OR_RETURN(RangeResponse r, etcd.GetPrefix(MembersPrefix(job)));
  if (revision != nullptr) *revision = r.revision;
  std::vector<Member> members;
  for (const KeyValue& kv : r.kvs) {
    PTC_ASSIGN_OR_RETURN(Member m, DecodeMember("etcd key " + kv.key, kv.value));
    if (kv.key != MemberKey(job, m.worker)) {
      return CorruptionError("etcd key " + kv.key + ": holds worker " + std::to_string(m.worker));
    }
    members.push_back(std::move(m));
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.worker < b.worker; });
  return members;
}

Result<std::unique_ptr<Membership>> Membership::Join(const KvStore* etcd, MembershipOptions options,
                                                     const std::vector<Compare>& only_if) {
  PTC_RETURN_IF_ERROR(ValidateJobName(options.job));
  if (options.worker < 0) return InvalidArgumentError("worker " + std::to_string(options.worker) + " < 0");
  PTC_RETURN_IF_ERROR(ParsePeerAddress(options.address), "member address");
  if (options.ttl_seconds < 1) return InvalidArgumentError("member lease TTL < 1 s");
  const std::string key = MemberKey(options.job, options.worker);
  PTC_ASSIGN_OR_RETURN(Lease lease, etcd->GrantLease(options.ttl_seconds), "join " + key);
  TxnRequest txn;
  txn.compare = {Compare::Absent(key)};
  txn.compare.insert(txn.compare.end(), only_if.begin(), only_if.end());
  txn.success = {TxnOp::Put(key, EncodeMember({options.worker, options.address}), lease.id)};
  Result<TxnResponse> r = etcd->Txn(txn);
  if (!r.ok() || !r->succeeded) {
    (void)etcd->RevokeLease(lease.id);
    PTC_RETURN_IF_ERROR(r.status(), "join " + key);
    Result<std::optional<KeyValue>> holder = etcd->Get(key);
    if (holder.ok() && !holder->has_value() && !only_if.empty()) {
      return FailedPreconditionError("join " + key + ": the job changed since this worker read it");
    }
    std::string who = "another daemon";
    if (holder.ok() && holder->has_value()) {
      Result<Member> m = DecodeMember(key, (*holder)->value);
      if (m.ok()) who = "the daemon at " + m->address;
    }
    return AlreadyExistsError("join " + key + ": worker " + std::to_string(options.worker) + " of job '" + options.job +
                              "' is held by " + who);
  }
  std::unique_ptr<Membership> m(new Membership(etcd, std::move(options), lease.id));
  m->thread_ = std::thread([p = m.get()] { p->KeepAlive(); });
  return m;
}

Membership::Membership(const KvStore* etcd, MembershipOptions options, int64_t lease)
    : etcd_(etcd), options_(std::move(options)), lease_(lease), stop_(std::make_unique<Stop>()) {}

Membership::~Membership() { (void)Leave(); }

void Membership::KeepAlive() {
  using Clock = std::chrono::steady_clock;
  const auto ttl = std::chrono::seconds(options_.ttl_seconds);
  const auto interval = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(100), ttl / 3);
  Clock::time_point renewed = Clock::now();
  while (!stop_->WaitFor(interval)) {
    Result<int64_t> r = etcd_->KeepAliveOnce(lease_);
    if (r.ok()) {
      renewed = Clock::now();
      MutexLock lock(&mu_);
      health_ = Status::OK();  // etcd back: it renews every lease as it starts
      continue;
    }
    const std::string what = "member " + MemberKey(options_.job, options_.worker) + ": ";
    if (r.status().code() == Code::kNotFound) {
      MutexLock lock(&mu_);
      health_ = NotFoundError(what + "lease lost: " + r.status().message());
      return;
    }
    if (Clock::now() - renewed > ttl) {
      MutexLock lock(&mu_);
      health_ = IOError(what + "no renewal for " + std::to_string(options_.ttl_seconds) + " s: " + r.status().message());
    }
  }
}

Status Membership::Leave() {
  {
    MutexLock lock(&mu_);
    if (left_) return Status::OK();
    left_ = true;
  }
  stop_->Notify();
  if (thread_.joinable()) thread_.join();
  return etcd_->RevokeLease(lease_).WithContext("leave " + MemberKey(options_.job, options_.worker));
}

Status Membership::health() const {
  MutexLock lock(&mu_);
  return health_;
}

}  // namespace ptc::cluster
