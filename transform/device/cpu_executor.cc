#include "transform/device/cpu_executor.h"

#include <memory>
#include <thread>

namespace ptc::transform::device {

Status InProcessTransport::Exchange(int rank, std::span<const SwitchMessage> sends,
                                    std::span<const SwitchMessage> recvs) {
  for (const auto* list : {&sends, &recvs}) {
    for (const SwitchMessage& m : *list) {
      if (m.peer < 0 || m.peer >= world_ || m.peer == rank) {
        return InvalidArgumentError("switch: rank " + std::to_string(rank) + " exchanges with rank " +
                                    std::to_string(m.peer) + " in a world of " + std::to_string(world_));
      }
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (const SwitchMessage& m : sends) {
    const auto* p = static_cast<const unsigned char*>(m.data);
    boxes_[{rank, m.peer}].emplace_back(p, p + m.bytes);
    sent_[rank] += m.bytes;
  }
  cv_.notify_all();
  for (const SwitchMessage& m : recvs) {
    auto& box = boxes_[{m.peer, rank}];
    cv_.wait(lock, [&] { return aborted_ || !box.empty(); });
    if (aborted_) return FailedPreconditionError("switch: another rank failed");
    std::vector<unsigned char> data = std::move(box.front());
    box.pop_front();
    if (data.size() != m.bytes) {
      return InternalError("switch: rank " + std::to_string(rank) + " expected " + std::to_string(m.bytes) +
                           " bytes from rank " + std::to_string(m.peer) + ", got " + std::to_string(data.size()));
    }
    std::copy(data.begin(), data.end(), static_cast<unsigned char*>(m.data));
  }
  return Status();
}

void InProcessTransport::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

uint64_t InProcessTransport::bytes_sent(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_[rank];
}

namespace {

void RunCopies(const std::vector<StridedCopy>& copies, const std::vector<const void*>& from,
               const std::vector<void*>& to, unsigned char* staging) {
  for (const StridedCopy& c : copies) {
    const void* s = c.src == kStagingBuffer ? staging : from[c.src];
    void* d = c.dst == kStagingBuffer ? staging : to[c.dst];
    ApplyCopy(c, s, d);
  }
}

}  // namespace

Status RunSwitchCpu(const SwitchPlan& plan, int rank, const std::vector<const void*>& from,
                    const std::vector<void*>& to, SwitchTransport& transport, CpuSwitchStats* stats) {
  if (rank < 0 || rank >= plan.world) {
    return InvalidArgumentError("switch: rank " + std::to_string(rank) + " outside the plan's world of " +
                                std::to_string(plan.world));
  }
  const RankSchedule& rs = plan.ranks[rank];
  if (from.size() != rs.from.size() || to.size() != rs.to.size()) {
    return InvalidArgumentError("switch: rank " + std::to_string(rank) + " gave " + std::to_string(from.size()) +
                                " + " + std::to_string(to.size()) + " buffers, the plan has " +
                                std::to_string(rs.from.size()) + " + " + std::to_string(rs.to.size()));
  }
  RunCopies(rs.local, from, to, nullptr);
  std::unique_ptr<unsigned char[]> staging(new unsigned char[rs.staging_bytes + 1]);
  CpuSwitchStats st;
  st.staging_bytes = rs.staging_bytes;
  std::vector<SwitchMessage> sends, recvs;
  for (const SwitchBucket& b : rs.buckets) {
    RunCopies(b.pack, from, to, staging.get());
    sends.clear();
    recvs.clear();
    for (const PeerSpan& s : b.sends) sends.push_back({s.peer, staging.get() + s.offset, s.bytes}), st.bytes_sent += s.bytes;
    for (const PeerSpan& s : b.recvs) recvs.push_back({s.peer, staging.get() + s.offset, s.bytes}), st.bytes_received += s.bytes;
    // Every rank takes part in every bucket (a collective), even with nothing to move.
    PTC_RETURN_IF_ERROR(transport.Exchange(rank, sends, recvs), "rank " + std::to_string(rank));
    RunCopies(b.unpack, from, to, staging.get());
    ++st.buckets;
  }
  if (stats) *stats = st;
  return Status();
}

Status RunSwitchThreads(const SwitchPlan& plan, const std::vector<std::vector<const void*>>& from,
                        const std::vector<std::vector<void*>>& to, std::vector<CpuSwitchStats>* stats) {
  if (static_cast<int>(from.size()) != plan.world || static_cast<int>(to.size()) != plan.world) {
    return InvalidArgumentError("switch: buffers for " + std::to_string(from.size()) + " ranks, the plan has " +
                                std::to_string(plan.world));
  }
  InProcessTransport transport(plan.world);
  std::vector<Status> results(plan.world);
  std::vector<CpuSwitchStats> st(plan.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < plan.world; ++r) {
    threads.emplace_back([&, r] {
      results[r] = RunSwitchCpu(plan, r, from[r], to[r], transport, &st[r]);
      if (!results[r].ok()) transport.Abort();
    });
  }
  for (std::thread& t : threads) t.join();
  if (stats) *stats = std::move(st);
  for (const Status& s : results) {
    if (!s.ok() && s.code() != Code::kFailedPrecondition) return s;
  }
  for (const Status& s : results) PTC_RETURN_IF_ERROR(s);
  return Status();
}

}  // namespace ptc::transform::device
