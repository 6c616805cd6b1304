// The CPU executor of a switch plan: the same schedule the CUDA executor
// runs, over host memory, so that every plan is checked bit for bit without a
// GPU. Ranks are threads of one process (InProcessTransport, RunSwitchThreads)
// or processes that bring their own transport (a SwitchTransport over
// torch.distributed through the C API, switch_c_api.h).
//
// Per rank: the local copies, then for each bucket: pack into staging, one
// grouped exchange (every send and receive of the bucket), unpack.
//
// Thread safety: RunSwitchCpu may run concurrently for different ranks of one
// plan; InProcessTransport is thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ptc/base/status.h"
#include "transform/device/switch_plan.h"

namespace ptc::transform::device {

struct SwitchMessage {
  int peer = 0;
  void* data = nullptr;  // sends: read only
  uint64_t bytes = 0;
};

// Moves one bucket's messages between ranks: all of `sends` and `recvs` as
// one group (no ordering between them may be assumed, as with NCCL's group
// calls). Returns when every receive is complete and the send buffers may be
// reused.
class SwitchTransport {
 public:
  virtual ~SwitchTransport() = default;
  virtual Status Exchange(int rank, std::span<const SwitchMessage> sends, std::span<const SwitchMessage> recvs) = 0;
};

// Ranks as threads: a mailbox per (sender, receiver); sends never block.
class InProcessTransport : public SwitchTransport {
 public:
  explicit InProcessTransport(int world) : world_(world), sent_(world, 0) {}
  // \error FailedPrecondition after Abort; Internal when a message's size is
  //        not what the receiver expects (the ranks run different plans).
  Status Exchange(int rank, std::span<const SwitchMessage> sends, std::span<const SwitchMessage> recvs) override;
  // Wakes every waiting receiver with an error (a rank failed).
  void Abort();
  uint64_t bytes_sent(int rank) const;

 private:
  const int world_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> boxes_;
  std::vector<uint64_t> sent_;
  bool aborted_ = false;
};

struct CpuSwitchStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t staging_bytes = 0;  // the staging buffer allocated
  uint64_t buckets = 0;
};

// Runs rank `rank`'s part of `plan`. `from[i]` holds plan.ranks[rank].from[i]
// (BufferBytes of it), `to[i]` receives plan.ranks[rank].to[i]; bytes of `to`
// that no segment covers (ZeRO padding) are left as they are.
// REQUIRES: no A buffer overlaps a B buffer; every rank of the plan runs it
//           with the same transport.
// \error InvalidArgument when the buffer counts differ from the plan's;
//        as the transport.
Status RunSwitchCpu(const SwitchPlan& plan, int rank, const std::vector<const void*>& from,
                    const std::vector<void*>& to, SwitchTransport& transport, CpuSwitchStats* stats = nullptr);

// Every rank of `plan` as a thread over an InProcessTransport.
// \error the first rank's error.
Status RunSwitchThreads(const SwitchPlan& plan, const std::vector<std::vector<const void*>>& from,
                        const std::vector<std::vector<void*>>& to, std::vector<CpuSwitchStats>* stats = nullptr);

}  // namespace ptc::transform::device
