#include "cluster/mem_kv_store.h"

namespace ptc::cluster {
namespace {

std::string Quoted(std::string_view key) { return "'" + std::string(key) + "'"; }

template <typename T>
bool Compares(const T& a, Compare::Op op, const T& b) {
  switch (op) {
    case Compare::Op::kEqual:
      return a == b;
    case Compare::Op::kNotEqual:
      return a != b;
    case Compare::Op::kGreater:
      return a > b;
    case Compare::Op::kLess:
      return a < b;
  }
  return false;
}

}  // namespace

MemKv::MemKv() = default;
MemKv::~MemKv() = default;

std::unique_ptr<MemKvClient> MemKv::Connect() { return std::make_unique<MemKvClient>(this); }

int64_t MemKv::revision() const {
  MutexLock lock(&mu_);
  return revision_;
}

bool MemKv::ExpireLease(int64_t lease) {
  MutexLock lock(&mu_);
  if (leases_.erase(lease) == 0) return false;
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (it->second.lease == lease) {
      pending_.push_back(it->first);
      it = keys_.erase(it);
    } else {
      ++it;
    }
  }
  Written();
  return true;
}

Status MemKv::CheckLease(int64_t lease) const {
  if (lease != 0 && !leases_.count(lease)) return NotFoundError("kv (memory): lease " + std::to_string(lease) + " not found");
  return Status::OK();
}

void MemKv::PutLocked(std::string_view key, std::string_view value, int64_t lease) {
  auto it = keys_.find(key);
  const int64_t revision = revision_ + 1;
  if (it == keys_.end()) {
    it = keys_.emplace(std::string(key), KeyValue{std::string(key), "", revision, revision, 0, 0}).first;
  }
  KeyValue& kv = it->second;
  kv.value = std::string(value);
  kv.mod_revision = revision;
  kv.version += 1;
  kv.lease = lease;
  pending_.emplace_back(key);
}

int64_t MemKv::DeleteLocked(std::string_view key, bool prefix) {
  int64_t n = 0;
  auto it = keys_.lower_bound(key);
  while (it != keys_.end() && (prefix ? it->first.starts_with(key) : it->first == key)) {
    pending_.push_back(it->first);
    it = keys_.erase(it);
    ++n;
  }
  return n;
}

bool MemKv::Holds(const Compare& c) const {
  auto it = keys_.find(c.key);
  const KeyValue absent;
  const KeyValue& kv = it == keys_.end() ? absent : it->second;
  switch (c.target) {
    case Compare::Target::kVersion:
      return Compares(kv.version, c.op, c.number);
    case Compare::Target::kCreateRevision:
      return Compares(kv.create_revision, c.op, c.number);
    case Compare::Target::kModRevision:
      return Compares(kv.mod_revision, c.op, c.number);
    case Compare::Target::kValue:
      return it != keys_.end() && Compares(kv.value, c.op, c.value);  // as etcd: no value to compare
  }
  return false;
}

void MemKv::Written() {
  if (pending_.empty()) return;
  ++revision_;
  for (std::string& key : pending_) log_.emplace_back(revision_, std::move(key));
  pending_.clear();
  changed_.SignalAll();
}

Status MemKvClient::Reach(std::string_view what, std::string_view key) const {
  if (cut_ || !kv_->reachable()) {
    return IOError("kv (memory): " + std::string(what) + " " + Quoted(key) + ": store unreachable");
  }
  return Status::OK();
}

Status MemKvClient::Answer(std::string_view what, std::string_view key) const {
  if (lose_.load() > 0 && lose_.fetch_sub(1) > 0) {
    if (cut_after_loss_) cut_ = true;
    return IOError("kv (memory): " + std::string(what) + " " + Quoted(key) + ": answer lost");
  }
  return Status::OK();
}

Status MemKvClient::Health() const { return Reach("health", ""); }

Result<int64_t> MemKvClient::Put(std::string_view key, std::string_view value, int64_t lease) const {
  PTC_RETURN_IF_ERROR(Reach("put", key));
  int64_t revision = 0;
  {
    MutexLock lock(&kv_->mu_);
    PTC_RETURN_IF_ERROR(kv_->CheckLease(lease));
    kv_->PutLocked(key, value, lease);
    kv_->Written();
    revision = kv_->revision_;
  }
  PTC_RETURN_IF_ERROR(Answer("put", key));
  return revision;
}

Result<std::optional<KeyValue>> MemKvClient::Get(std::string_view key) const {
  PTC_RETURN_IF_ERROR(Reach("get", key));
  MutexLock lock(&kv_->mu_);
  auto it = kv_->keys_.find(key);
  if (it == kv_->keys_.end()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(it->second);
}

Result<RangeResponse> MemKvClient::GetPrefix(std::string_view prefix) const {
  PTC_RETURN_IF_ERROR(Reach("range", prefix));
  MutexLock lock(&kv_->mu_);
  RangeResponse r;
  r.revision = kv_->revision_;
  for (auto it = kv_->keys_.lower_bound(prefix); it != kv_->keys_.end() && it->first.starts_with(prefix); ++it) {
    r.kvs.push_back(it->second);
  }
  return r;
}

Result<int64_t> MemKvClient::Delete(std::string_view key) const {
  PTC_RETURN_IF_ERROR(Reach("delete", key));
  int64_t n = 0;
  {
    MutexLock lock(&kv_->mu_);
    n = kv_->DeleteLocked(key, false);
    kv_->Written();
  }
  PTC_RETURN_IF_ERROR(Answer("delete", key));
  return n;
}

Result<int64_t> MemKvClient::DeletePrefix(std::string_view prefix) const {
  PTC_RETURN_IF_ERROR(Reach("delete range", prefix));
  int64_t n = 0;
  {
    MutexLock lock(&kv_->mu_);
    n = kv_->DeleteLocked(prefix, true);
    kv_->Written();
  }
  PTC_RETURN_IF_ERROR(Answer("delete range", prefix));
  return n;
}

Result<Lease> MemKvClient::GrantLease(int64_t ttl_seconds) const {
  if (ttl_seconds < 1) return InvalidArgumentError("kv (memory): lease TTL " + std::to_string(ttl_seconds) + " < 1");
  PTC_RETURN_IF_ERROR(Reach("lease grant", ""));
  Lease lease;
  {
    MutexLock lock(&kv_->mu_);
    lease = {kv_->next_lease_++, ttl_seconds};
    kv_->leases_[lease.id] = {ttl_seconds};
  }
  PTC_RETURN_IF_ERROR(Answer("lease grant", ""));
  return lease;
}

Result<int64_t> MemKvClient::KeepAliveOnce(int64_t lease) const {
  PTC_RETURN_IF_ERROR(Reach("lease keep-alive", std::to_string(lease)));
  MutexLock lock(&kv_->mu_);
  auto it = kv_->leases_.find(lease);
  if (it == kv_->leases_.end()) return NotFoundError("kv (memory): lease " + std::to_string(lease) + " not found");
  return it->second.ttl;
}

Result<int64_t> MemKvClient::LeaseTimeToLive(int64_t lease) const {
  PTC_RETURN_IF_ERROR(Reach("lease time-to-live", std::to_string(lease)));
  MutexLock lock(&kv_->mu_);
  auto it = kv_->leases_.find(lease);
  return it == kv_->leases_.end() ? int64_t{-1} : it->second.ttl;
}

Status MemKvClient::RevokeLease(int64_t lease) const {
  PTC_RETURN_IF_ERROR(Reach("lease revoke", std::to_string(lease)));
  if (!kv_->ExpireLease(lease)) return NotFoundError("kv (memory): lease " + std::to_string(lease) + " not found");
  return Answer("lease revoke", std::to_string(lease));
}

Result<TxnResponse> MemKvClient::Txn(const TxnRequest& txn) const {
  const std::string first = txn.compare.empty() ? "" : txn.compare.front().key;
  PTC_RETURN_IF_ERROR(Reach("txn", first));
  TxnResponse r;
  {
    MutexLock lock(&kv_->mu_);
    r.succeeded = true;
    for (const Compare& c : txn.compare) r.succeeded = r.succeeded && kv_->Holds(c);
    const std::vector<TxnOp>& ops = r.succeeded ? txn.success : txn.failure;
    for (const TxnOp& op : ops) {
      if (op.kind == TxnOp::Kind::kPut) PTC_RETURN_IF_ERROR(kv_->CheckLease(op.lease));  // nothing applied
    }
    for (const TxnOp& op : ops) {
      switch (op.kind) {
        case TxnOp::Kind::kPut:
          kv_->PutLocked(op.key, op.value, op.lease);
          break;
        case TxnOp::Kind::kDelete:
          kv_->DeleteLocked(op.key, false);
          break;
        case TxnOp::Kind::kDeletePrefix:
          kv_->DeleteLocked(op.key, true);
          break;
      }
    }
    kv_->Written();
    r.revision = kv_->revision_;
  }
  PTC_RETURN_IF_ERROR(Answer("txn", first));
  return r;
}

Result<bool> MemKvClient::WaitForChange(std::string_view prefix, int64_t revision,
                                        std::chrono::milliseconds timeout) const {
  PTC_RETURN_IF_ERROR(Reach("watch", prefix));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&kv_->mu_);
  for (;;) {
    // The log is in revision order: look back from its end to `revision`.
    for (auto it = kv_->log_.rbegin(); it != kv_->log_.rend() && it->first > revision; ++it) {
      if (it->second.starts_with(prefix)) return true;
    }
    if (cut_ || !kv_->reachable()) return IOError("kv (memory): watch " + Quoted(prefix) + ": store unreachable");
    if (!kv_->changed_.WaitUntil(deadline)) return false;
  }
}

}  // namespace ptc::cluster
