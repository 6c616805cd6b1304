// The CUDA/NCCL executor of a switch plan (built when PTCFS_WITH_CUDA is 1):
// the CPU executor's schedule (cpu_executor.h) on device memory.
//
// Per rank: the local copies and each bucket's pack run as one kernel launch
// each (cuda_kernels.cu: every descriptor of the list in one grid, writing
// straight into the target buffers); a bucket's messages are one NCCL group
// (ncclGroupStart, one ncclSend/ncclRecv per peer, ncclGroupEnd); then one
// unpack launch. Everything is queued on the caller's stream, in order, so
// the call returns before the data has moved. Staging is allocated once per
// runner (the plan's staging_bytes for the rank: within the budget).
//
// This header does not include CUDA: streams and communicators are passed as
// void* (cudaStream_t, ncclComm_t), so the C API compiles without CUDA.
//
// Thread safety: a runner is used by one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ptc/base/status.h"
#include "transform/device/switch_plan.h"

namespace ptc::transform::device {

// True when the library was built with CUDA and NCCL.
bool SwitchHasCuda();
// True when a CUDA device is present; otherwise *why says what failed.
bool CudaDevicePresent(std::string* why);

class CudaSwitchRunner {
 public:
  // Uploads rank's descriptors and allocates its staging on the current device.
  // \error FailedPrecondition without CUDA (not built, or no device); IOError naming the failed CUDA call.
  static Result<std::unique_ptr<CudaSwitchRunner>> Create(std::shared_ptr<const SwitchPlan> plan, int rank);
  ~CudaSwitchRunner();

  // The whole switch with messages over NCCL (comm: an ncclComm_t of the plan's world).
  // \error InvalidArgument for buffer counts; IOError naming the failed CUDA or NCCL call.
  Status Run(const std::vector<const void*>& from, const std::vector<void*>& to, void* stream, void* comm);

  // The steps, for executors that move the messages themselves (the
  // streams-in-one-process test, the benchmark). SetBuffers uploads the
  // buffer table (stream-ordered); the others queue kernels on `stream`.
  Status SetBuffers(const std::vector<const void*>& from, const std::vector<void*>& to, void* stream);
  Status Local(void* stream);
  Status Pack(size_t bucket, void* stream);
  Status Unpack(size_t bucket, void* stream);
  unsigned char* staging() const;
  const RankSchedule& schedule() const;

 private:
  struct Impl;
  explicit CudaSwitchRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Every rank of `plan` on one device, rank r on streams[r]: the messages are
// device-to-device copies between the ranks' staging, ordered with events.
// Returns when all streams are done.
// \error as CudaSwitchRunner.
Status RunSwitchCudaStreams(std::shared_ptr<const SwitchPlan> plan, const std::vector<std::vector<const void*>>& from,
                            const std::vector<std::vector<void*>>& to, const std::vector<void*>& streams);

// NCCL bootstrap (ncclGetUniqueId, ncclCommInitRank, ncclCommDestroy).
// \error FailedPrecondition without CUDA; IOError naming the failed NCCL call.
Status NcclUniqueId(char id[128]);
Status NcclCommCreate(const char id[128], int world, int rank, void** comm);
Status NcclCommDestroy(void* comm);

}  // namespace ptc::transform::device
