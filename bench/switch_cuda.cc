// switch_cuda_bench: throughput of the switch's pack/unpack kernels against
// cudaMemcpy device-to-device for the same bytes (bench/device_check.sh).
//
// Model: Llama-2 7B's layer shapes with 4 layers (bf16 parameters and
// gradients). For rank 0 of each layout pair it times the kernels alone (the
// local copies, every bucket's pack and unpack; no messages) and one
// cudaMemcpyAsync of as many bytes, medians of --iters runs, and prints
//   pair  bytes  kernel GB/s  memcpy GB/s  ratio
// Exit 0 when every ratio is >= --min-ratio (default 0.8), else 1; 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ptc/model/schema.h"
#include "transform/device/cuda_executor.h"
#include "transform/device/switch_plan.h"

namespace {

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

void Check(const ptc::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "switch_cuda_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  double min_ratio = 0.8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--min-ratio")) min_ratio = std::atof(argv[i + 1]);
  }
  std::string why;
  if (!ptc::transform::device::CudaDevicePresent(&why)) {
    std::printf("SKIPPED: switch_cuda_bench needs a CUDA device: %s\n", why.c_str());
    return 77;
  }
  const char* dims = "layers=4,hidden=4096,heads=32,kv_heads=32,vocab=32000,seq=4096,ffn=11008";
  const std::vector<std::pair<const char*, const char*>> pairs = {
      {"dp=8", "tp=8"},                    // local repack only: strided slices of whole tensors
      {"tp=8", "tp=4,pp=2"},               // pack and unpack, row- and column-parallel pieces
      {"tp=2,pp=2,dp=2", "tp=1,pp=1,dp=8"},  // gather: everything packed and unpacked
  };
  bool ok = true;
  std::printf("%-32s %12s %12s %12s %7s\n", "pair (rank 0, bf16 params+grads)", "bytes", "kernel GB/s", "memcpy GB/s",
              "ratio");
  for (const auto& [a, b] : pairs) {
    ptc::transform::device::SwitchRequest req;
    req.spec.schema = *ptc::LoadSchema("llama");
    req.spec.dims = *ptc::ParseDims(dims);
    req.from = *ptc::ParseConfig(a);
    req.to = *ptc::ParseConfig(b);
    req.budget_bytes = 4ull << 30;  // one bucket: the kernels, not the bucket count, are measured
    auto plan = ptc::transform::device::MakeSwitchPlan(req);
    Check(plan.status());
    auto shared = std::make_shared<const ptc::transform::device::SwitchPlan>(std::move(*plan));
    const ptc::transform::device::RankSchedule& rs = shared->ranks[0];
    std::vector<const void*> from;
    std::vector<void*> to;
    for (const auto& t : rs.from) {
      void* p;
      CHECK_CUDA(cudaMalloc(&p, ptc::transform::device::BufferBytes(t)));
      CHECK_CUDA(cudaMemset(p, 1, ptc::transform::device::BufferBytes(t)));
      from.push_back(p);
    }
    for (const auto& t : rs.to) {
      void* p;
      CHECK_CUDA(cudaMalloc(&p, ptc::transform::device::BufferBytes(t)));
      to.push_back(p);
    }
    auto runner = ptc::transform::device::CudaSwitchRunner::Create(shared, 0);
    Check(runner.status());
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    Check((*runner)->SetBuffers(from, to, stream));
    uint64_t bytes = rs.bytes_local;
    for (const auto& bucket : rs.buckets) {
      for (const auto& c : bucket.pack) bytes += c.bytes();
      for (const auto& c : bucket.unpack) bytes += c.bytes();
    }
    void *src, *dst;
    CHECK_CUDA(cudaMalloc(&src, bytes));
    CHECK_CUDA(cudaMalloc(&dst, bytes));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<double> kernel, memcpy_ms;
    for (int it = 0; it < iters + 2; ++it) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      Check((*runner)->Local(stream));
      for (size_t k = 0; k < rs.buckets.size(); ++k) {
        Check((*runner)->Pack(k, stream));
        Check((*runner)->Unpack(k, stream));
      }
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (it >= 2) kernel.push_back(ms);
      CHECK_CUDA(cudaEventRecord(start, stream));
      CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (it >= 2) memcpy_ms.push_back(ms);
    }
    const double k = bytes / Median(kernel) / 1e6, m = bytes / Median(memcpy_ms) / 1e6;
    const std::string name = std::string(a) + " -> " + b;
    std::printf("%-32s %12llu %12.1f %12.1f %7.2f%s\n", name.c_str(), static_cast<unsigned long long>(bytes), k, m,
                k / m, k / m >= min_ratio ? "" : "  BELOW");
    ok = ok && k / m >= min_ratio;
    runner->reset();
    cudaFree(src);
    cudaFree(dst);
    for (const void* p : from) cudaFree(const_cast<void*>(p));
    for (void* p : to) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  std::printf("repack throughput >= %.2fx cudaMemcpy D2D: %s\n", min_ratio, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
