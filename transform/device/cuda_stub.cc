// The CUDA executor where the library is built without CUDA (PTCFS_WITH_CUDA
// off or not found): every entry point says so.
#include "transform/device/cuda_executor.h"

namespace ptc::transform::device {
namespace {
Status NoCuda() {
  return FailedPreconditionError("switch: ptcfs was built without CUDA/NCCL (PTCFS_WITH_CUDA=OFF or not found)");
}
}  // namespace

struct CudaSwitchRunner::Impl {};

bool SwitchHasCuda() { return false; }
bool CudaDevicePresent(std::string* why) {
  if (why) *why = "ptcfs was built without CUDA";
  return false;
}
Result<std::unique_ptr<CudaSwitchRunner>> CudaSwitchRunner::Create(std::shared_ptr<const SwitchPlan>, int) {
  return NoCuda();
}
CudaSwitchRunner::CudaSwitchRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSwitchRunner::~CudaSwitchRunner() = default;
Status CudaSwitchRunner::Run(const std::vector<const void*>&, const std::vector<void*>&, void*, void*) {
  return NoCuda();
}
Status CudaSwitchRunner::SetBuffers(const std::vector<const void*>&, const std::vector<void*>&, void*) {
  return NoCuda();
}
Status CudaSwitchRunner::Local(void*) { return NoCuda(); }
Status CudaSwitchRunner::Pack(size_t, void*) { return NoCuda(); }
Status CudaSwitchRunner::Unpack(size_t, void*) { return NoCuda(); }
unsigned char* CudaSwitchRunner::staging() const { return nullptr; }
const RankSchedule& CudaSwitchRunner::schedule() const {
  static const RankSchedule empty;
  return empty;
}
Status RunSwitchCudaStreams(std::shared_ptr<const SwitchPlan>, const std::vector<std::vector<const void*>>&,
                            const std::vector<std::vector<void*>>&, const std::vector<void*>&) {
  return NoCuda();
}
Status NcclUniqueId(char*) { return NoCuda(); }
Status NcclCommCreate(const char*, int, int, void**) { return NoCuda(); }
Status NcclCommDestroy(void*) { return NoCuda(); }

}  // namespace ptc::transform::device
