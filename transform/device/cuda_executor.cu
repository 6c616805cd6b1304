// The CUDA/NCCL executor (cuda_executor.h).
#include "transform/device/cuda_executor.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "transform/device/cuda_kernels.h"

namespace ptc::transform::device {
namespace {

Status CudaError(const char* call, cudaError_t e) {
  return IOError(std::string("switch: ") + call + ": " + cudaGetErrorString(e));
}
Status NcclError(const char* call, ncclResult_t r) {
  return IOError(std::string("switch: ") + call + ": " + ncclGetErrorString(r));
}
#define PTC_CUDA(call)                                        \
  do {                                                        \
    cudaError_t ptc_e_ = (call);                              \
    if (ptc_e_ != cudaSuccess) return CudaError(#call, ptc_e_); \
  } while (0)
#define PTC_NCCL(call)                                        \
  do {                                                        \
    ncclResult_t ptc_r_ = (call);                             \
    if (ptc_r_ != ncclSuccess) return NcclError(#call, ptc_r_); \
  } while (0)

// Device memory, freed on destruction.
struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  Status Allocate(size_t bytes) {
    PTC_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    return Status();
  }
};

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

struct CudaSwitchRunner::Impl {
  std::shared_ptr<const SwitchPlan> plan;
  int rank = 0;
  DeviceBuffer copies, blocks, table, staging;  // descriptors, block offsets, buffer addresses, staging
  DeviceCopyList local;
  std::vector<DeviceCopyList> pack, unpack;
  std::vector<const void*> last;  // the addresses uploaded last (from, then to)
  const RankSchedule& rs() const { return plan->ranks[rank]; }
  const void* const* from_table() const { return static_cast<const void* const*>(table.p); }
  void* const* to_table() const { return static_cast<void* const*>(table.p) + rs().from.size(); }
};

bool SwitchHasCuda() { return true; }

bool CudaDevicePresent(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "cudaGetDeviceCount found no CUDA device";
    return false;
  }
  return true;
}

Result<std::unique_ptr<CudaSwitchRunner>> CudaSwitchRunner::Create(std::shared_ptr<const SwitchPlan> plan, int rank) {
  std::string why;
  if (!CudaDevicePresent(&why)) return FailedPreconditionError("switch: no CUDA device (" + why + ")");
  if (rank < 0 || rank >= plan->world) return InvalidArgumentError("switch: rank " + std::to_string(rank) + " outside the plan");
  auto impl = std::make_unique<Impl>();
  impl->plan = std::move(plan);
  impl->rank = rank;
  const RankSchedule& rs = impl->rs();
  // All descriptor lists in one array: local, then pack and unpack of each bucket.
  std::vector<StridedCopy> all;
  std::vector<uint32_t> first;
  std::vector<std::pair<size_t, size_t>> ranges;  // (first descriptor, count) per list
  auto add = [&](const std::vector<StridedCopy>& list) {
    ranges.emplace_back(all.size(), list.size());
    all.insert(all.end(), list.begin(), list.end());
  };
  add(rs.local);
  for (const SwitchBucket& b : rs.buckets) add(b.pack), add(b.unpack);
  // Block offsets per list: count + 1 entries each, laid out list after list.
  std::vector<size_t> first_at;
  std::vector<uint32_t> totals;
  for (const auto& [begin, count] : ranges) {
    first_at.push_back(first.size());
    uint32_t acc = 0;
    for (size_t i = 0; i < count; ++i) first.push_back(acc), acc += BlocksFor(all[begin + i].bytes());
    first.push_back(acc);
    totals.push_back(acc);
  }
  PTC_RETURN_IF_ERROR(impl->copies.Allocate(all.size() * sizeof(StridedCopy)));
  PTC_RETURN_IF_ERROR(impl->blocks.Allocate(first.size() * sizeof(uint32_t)));
  PTC_RETURN_IF_ERROR(impl->table.Allocate((rs.from.size() + rs.to.size()) * sizeof(void*)));
  PTC_RETURN_IF_ERROR(impl->staging.Allocate(rs.staging_bytes));
  PTC_CUDA(cudaMemcpy(impl->copies.p, all.data(), all.size() * sizeof(StridedCopy), cudaMemcpyHostToDevice));
  PTC_CUDA(cudaMemcpy(impl->blocks.p, first.data(), first.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  auto list = [&](size_t k) {
    DeviceCopyList l;
    l.copies = static_cast<const StridedCopy*>(impl->copies.p) + ranges[k].first;
    l.first_block = static_cast<const uint32_t*>(impl->blocks.p) + first_at[k];
    l.count = static_cast<int>(ranges[k].second);
    l.blocks = totals[k];
    return l;
  };
  impl->local = list(0);
  for (size_t b = 0; b < rs.buckets.size(); ++b) {
    impl->pack.push_back(list(1 + 2 * b));
    impl->unpack.push_back(list(2 + 2 * b));
  }
  return std::unique_ptr<CudaSwitchRunner>(new CudaSwitchRunner(std::move(impl)));
}

CudaSwitchRunner::CudaSwitchRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSwitchRunner::~CudaSwitchRunner() = default;

Status CudaSwitchRunner::SetBuffers(const std::vector<const void*>& from, const std::vector<void*>& to, void* stream) {
  const RankSchedule& rs = impl_->rs();
  if (from.size() != rs.from.size() || to.size() != rs.to.size()) {
    return InvalidArgumentError("switch: rank " + std::to_string(impl_->rank) + " gave " +
                                std::to_string(from.size()) + " + " + std::to_string(to.size()) +
                                " buffers, the plan has " + std::to_string(rs.from.size()) + " + " +
                                std::to_string(rs.to.size()));
  }
  std::vector<const void*> now(from.begin(), from.end());
  now.insert(now.end(), to.begin(), to.end());
  if (now == impl_->last) return Status();  // the same tensors as last time: nothing to upload
  // From pageable memory: returns once the addresses are staged, ordered on the stream.
  PTC_CUDA(cudaMemcpyAsync(impl_->table.p, now.data(), now.size() * sizeof(void*), cudaMemcpyHostToDevice,
                           AsStream(stream)));
  impl_->last = std::move(now);
  return Status();
}

Status CudaSwitchRunner::Local(void* stream) {
  PTC_CUDA(LaunchStridedCopies(impl_->local, impl_->from_table(), impl_->to_table(),
                               static_cast<unsigned char*>(impl_->staging.p), AsStream(stream)));
  return Status();
}

Status CudaSwitchRunner::Pack(size_t bucket, void* stream) {
  PTC_CUDA(LaunchStridedCopies(impl_->pack.at(bucket), impl_->from_table(), impl_->to_table(),
                               static_cast<unsigned char*>(impl_->staging.p), AsStream(stream)));
  return Status();
}

Status CudaSwitchRunner::Unpack(size_t bucket, void* stream) {
  PTC_CUDA(LaunchStridedCopies(impl_->unpack.at(bucket), impl_->from_table(), impl_->to_table(),
                               static_cast<unsigned char*>(impl_->staging.p), AsStream(stream)));
  return Status();
}

unsigned char* CudaSwitchRunner::staging() const { return static_cast<unsigned char*>(impl_->staging.p); }
const RankSchedule& CudaSwitchRunner::schedule() const { return impl_->rs(); }

Status CudaSwitchRunner::Run(const std::vector<const void*>& from, const std::vector<void*>& to, void* stream,
                             void* comm) {
  PTC_RETURN_IF_ERROR(SetBuffers(from, to, stream));
  PTC_RETURN_IF_ERROR(Local(stream));
  const RankSchedule& rs = impl_->rs();
  auto* nccl = static_cast<ncclComm_t>(comm);
  for (size_t b = 0; b < rs.buckets.size(); ++b) {
    const SwitchBucket& bucket = rs.buckets[b];
    PTC_RETURN_IF_ERROR(Pack(b, stream));
    if (!bucket.sends.empty() || !bucket.recvs.empty()) {
      if (nccl == nullptr) return InvalidArgumentError("switch: the plan moves data between ranks and no NCCL communicator was given");
      // One group per bucket: every peer's send and receive together.
      PTC_NCCL(ncclGroupStart());
      for (const PeerSpan& s : bucket.sends) {
        PTC_NCCL(ncclSend(staging() + s.offset, s.bytes, ncclUint8, s.peer, nccl, AsStream(stream)));
      }
      for (const PeerSpan& s : bucket.recvs) {
        PTC_NCCL(ncclRecv(staging() + s.offset, s.bytes, ncclUint8, s.peer, nccl, AsStream(stream)));
      }
      PTC_NCCL(ncclGroupEnd());
    }
    PTC_RETURN_IF_ERROR(Unpack(b, stream));
  }
  return Status();
}

Status RunSwitchCudaStreams(std::shared_ptr<const SwitchPlan> plan, const std::vector<std::vector<const void*>>& from,
                            const std::vector<std::vector<void*>>& to, const std::vector<void*>& streams) {
  const int world = plan->world;
  if (static_cast<int>(from.size()) != world || static_cast<int>(to.size()) != world ||
      static_cast<int>(streams.size()) != world) {
    return InvalidArgumentError("switch: buffers or streams for other than the plan's " + std::to_string(world) + " ranks");
  }
  std::vector<std::unique_ptr<CudaSwitchRunner>> runners;
  for (int r = 0; r < world; ++r) {
    PTC_ASSIGN_OR_RETURN(auto runner, CudaSwitchRunner::Create(plan, r));
    PTC_RETURN_IF_ERROR(runner->SetBuffers(from[r], to[r], streams[r]));
    PTC_RETURN_IF_ERROR(runner->Local(streams[r]));
    runners.push_back(std::move(runner));
  }
  std::vector<cudaEvent_t> packed(world), received(world);
  for (int r = 0; r < world; ++r) {
    PTC_CUDA(cudaEventCreateWithFlags(&packed[r], cudaEventDisableTiming));
    PTC_CUDA(cudaEventCreateWithFlags(&received[r], cudaEventDisableTiming));
  }
  Status status;
  for (size_t b = 0; b < plan->num_buckets && status.ok(); ++b) {
    for (int r = 0; r < world && status.ok(); ++r) {
      status = runners[r]->Pack(b, streams[r]);
      if (status.ok() && cudaEventRecord(packed[r], AsStream(streams[r])) != cudaSuccess) status = IOError("switch: cudaEventRecord");
    }
    // Each receiver copies its messages out of the senders' staging once they are packed.
    for (int r = 0; r < world && status.ok(); ++r) {
      for (const PeerSpan& in : plan->ranks[r].buckets[b].recvs) {
        const SwitchBucket& sender = plan->ranks[in.peer].buckets[b];
        const PeerSpan* out = nullptr;
        for (const PeerSpan& s : sender.sends) {
          if (s.peer == r) out = &s;
        }
        if (out == nullptr || out->bytes != in.bytes) {
          status = InternalError("switch: rank " + std::to_string(in.peer) + " sends rank " + std::to_string(r) +
                                 " other than it expects");
          break;
        }
        cudaError_t e = cudaStreamWaitEvent(AsStream(streams[r]), packed[in.peer], 0);
        if (e == cudaSuccess) {
          e = cudaMemcpyAsync(runners[r]->staging() + in.offset, runners[in.peer]->staging() + out->offset, in.bytes,
                              cudaMemcpyDeviceToDevice, AsStream(streams[r]));
        }
        if (e != cudaSuccess) status = CudaError("cudaMemcpyAsync", e);
      }
      if (status.ok()) status = runners[r]->Unpack(b, streams[r]);
      if (status.ok() && cudaEventRecord(received[r], AsStream(streams[r])) != cudaSuccess) status = IOError("switch: cudaEventRecord");
    }
    // No sender packs the next bucket before every receiver has read this one.
    for (int r = 0; r < world && status.ok(); ++r) {
      for (int q = 0; q < world; ++q) cudaStreamWaitEvent(AsStream(streams[r]), received[q], 0);
    }
  }
  for (int r = 0; r < world; ++r) {
    cudaError_t e = cudaStreamSynchronize(AsStream(streams[r]));
    if (status.ok() && e != cudaSuccess) status = CudaError("cudaStreamSynchronize", e);
    cudaEventDestroy(packed[r]);
    cudaEventDestroy(received[r]);
  }
  return status;
}

Status NcclUniqueId(char id[128]) {
  ncclUniqueId uid;
  PTC_NCCL(ncclGetUniqueId(&uid));
  static_assert(sizeof(uid.internal) == 128);
  std::memcpy(id, uid.internal, 128);
  return Status();
}

Status NcclCommCreate(const char id[128], int world, int rank, void** comm) {
  ncclUniqueId uid;
  std::memcpy(uid.internal, id, 128);
  ncclComm_t c;
  PTC_NCCL(ncclCommInitRank(&c, world, uid, rank));
  *comm = c;
  return Status();
}

Status NcclCommDestroy(void* comm) {
  PTC_NCCL(ncclCommDestroy(static_cast<ncclComm_t>(comm)));
  return Status();
}

}  // namespace ptc::transform::device
