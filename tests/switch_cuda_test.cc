// The CUDA/NCCL executor (transform/device/cuda_executor.h) on a GPU: the
// pack/unpack kernels give, bit for bit, what the CPU executor gives; several
// ranks as streams in one process; NCCL with every device this process sees
// (ncclCommInitAll). Without a GPU (or in a build without CUDA) the whole
// suite exits 77 with the reason, which ctest reports as skipped: CI has none.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "switch_util.h"
#include "test_util.h"
#include "transform/device/cpu_executor.h"
#include "transform/device/cuda_executor.h"

#if PTCFS_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

namespace ptc::transform::device {
namespace {

using namespace ::ptc::testing;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << #call

// Rank buffers on the device, copied from / to host references.
struct DeviceRanks {
  std::vector<std::vector<void*>> bufs;
  ~DeviceRanks() {
    for (auto& r : bufs) {
      for (void* p : r) cudaFree(p);
    }
  }
  void Upload(const std::vector<RankBytes>& host) {
    bufs.resize(host.size());
    for (size_t r = 0; r < host.size(); ++r) {
      for (const auto& d : host[r].data) {
        void* p = nullptr;
        CUDA_OK(cudaMalloc(&p, d.size() + 1));
        CUDA_OK(cudaMemcpy(p, d.data(), d.size(), cudaMemcpyHostToDevice));
        bufs[r].push_back(p);
      }
    }
  }
  std::vector<RankBytes> Download(std::vector<RankBytes> like) const {
    for (size_t r = 0; r < like.size(); ++r) {
      for (size_t i = 0; i < like[r].data.size(); ++i) {
        EXPECT_EQ(cudaMemcpy(like[r].data[i].data(), bufs[r][i], like[r].data[i].size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
    }
    return like;
  }
  std::vector<std::vector<const void*>> Const() const {
    std::vector<std::vector<const void*>> out;
    for (const auto& r : bufs) out.emplace_back(r.begin(), r.end());
    return out;
  }
};

// The CPU executor's result for `plan` from the reference of layout A.
std::vector<RankBytes> CpuResult(const SwitchRequest& req, const SwitchPlan& plan, std::vector<RankBytes> from,
                                 std::vector<RankBytes> to) {
  std::vector<std::vector<const void*>> f(plan.world);
  std::vector<std::vector<void*>> t(plan.world);
  for (int r = 0; r < plan.world; ++r) {
    for (auto& d : from[r].data) f[r].push_back(d.data());
    for (auto& d : to[r].data) t[r].push_back(d.data());
  }
  Status s = RunSwitchThreads(plan, f, t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return to;
}

std::vector<RankBytes> Filled(std::vector<RankBytes> like) {
  for (auto& r : like) {
    for (auto& d : r.data) std::fill(d.begin(), d.end(), kSwitchFill);
  }
  return like;
}

TEST(SwitchCuda, StreamsMatchCpuExecutorBitForBit) {
  const uint64_t seed = TestSeed();
  for (const SwitchCase& c : SwitchCases()) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
      for (uint64_t budget : {uint64_t{4096}, uint64_t{64} << 20}) {
        SCOPED_TRACE(c.from + " -> " + c.to + " " + std::string(DTypeName(dtype)) + " budget " + std::to_string(budget));
        SwitchRequest req = MakeRequest(c, dtype, budget);
        auto plan = MakeSwitchPlan(req);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        auto shared = std::make_shared<const SwitchPlan>(std::move(*plan));
        GlobalValues values(seed);
        auto from = ReferenceLayout(req.spec, req.from, shared->world, req.contents, values);
        auto want = ReferenceLayout(req.spec, req.to, shared->world, req.contents, values);
        auto cpu = CpuResult(req, *shared, from, Filled(want));
        DeviceRanks a, b;
        a.Upload(from);
        b.Upload(Filled(want));
        std::vector<cudaStream_t> streams(shared->world);
        std::vector<void*> sp;
        for (auto& s : streams) CUDA_OK(cudaStreamCreate(&s)), sp.push_back(s);
        Status st = RunSwitchCudaStreams(shared, a.Const(), b.bufs, sp);
        ASSERT_TRUE(st.ok()) << st.ToString();
        for (auto& s : streams) cudaStreamDestroy(s);
        auto got = b.Download(Filled(want));
        for (int r = 0; r < shared->world; ++r) {
          for (size_t i = 0; i < want[r].data.size(); ++i) {
            ASSERT_TRUE(cpu[r].data[i] == want[r].data[i]) << "CPU executor: rank " << r << " " << want[r].names[i];
            ASSERT_TRUE(got[r].data[i] == cpu[r].data[i]) << "CUDA: rank " << r << " " << want[r].names[i];
          }
        }
      }
    }
  }
}

TEST(SwitchCuda, PackKernelFillsStagingAsTheCpuDoes) {
  const uint64_t seed = TestSeed();
  SwitchRequest req = MakeRequest(SwitchCases()[0], DType::kBF16, 4096);
  auto plan = MakeSwitchPlan(req);
  ASSERT_TRUE(plan.ok());
  auto shared = std::make_shared<const SwitchPlan>(std::move(*plan));
  GlobalValues values(seed);
  auto from = ReferenceLayout(req.spec, req.from, shared->world, req.contents, values);
  auto to = Filled(ReferenceLayout(req.spec, req.to, shared->world, req.contents, values));
  DeviceRanks a, b;
  a.Upload(from);
  b.Upload(to);
  for (int r = 0; r < shared->world; ++r) {
    auto runner = CudaSwitchRunner::Create(shared, r);
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    ASSERT_TRUE((*runner)->SetBuffers(a.Const()[r], b.bufs[r], nullptr).ok());
    const RankSchedule& rs = shared->ranks[r];
    std::vector<const void*> hf;
    for (auto& d : from[r].data) hf.push_back(d.data());
    for (size_t k = 0; k < rs.buckets.size(); ++k) {
      ASSERT_TRUE((*runner)->Pack(k, nullptr).ok());
      std::vector<unsigned char> dev(rs.buckets[k].staging_bytes), host(rs.buckets[k].staging_bytes);
      CUDA_OK(cudaMemcpy(dev.data(), (*runner)->staging(), dev.size(), cudaMemcpyDeviceToHost));
      std::vector<unsigned char> got_staging = dev;
      for (const StridedCopy& c : rs.buckets[k].pack) ApplyCopy(c, hf[c.src], host.data());
      // Compare the packed messages (receive space and padding are not written by pack).
      for (const PeerSpan& s : rs.buckets[k].sends) {
        for (const StridedCopy& c : rs.buckets[k].pack) {
          const uint64_t at = c.dst_offset * c.elem_size;
          if (at < s.offset || at >= s.offset + s.bytes) continue;
          ASSERT_EQ(std::memcmp(got_staging.data() + at, host.data() + at, c.bytes()), 0)
              << "rank " << r << " bucket " << k;
        }
      }
    }
  }
}

TEST(SwitchCuda, NcclRanksInOneProcess) {
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  // NCCL takes one rank per device: a world of 8, 4, 2 or 1 of the devices this process sees.
  const int world = devices >= 8 ? 8 : devices >= 4 ? 4 : devices >= 2 ? 2 : 1;
  std::printf("NCCL over %d device(s)%s\n", world,
              world == 1 ? " (one device: a one-rank world, local copies and the NCCL path only)" : "");
  SwitchCase c{"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=1", "tp=1,pp=1"};
  if (world == 8) c.from = "tp=2,dp=4", c.to = "tp=4,pp=2";
  if (world == 4) c.from = "tp=2,pp=2", c.to = "tp=4";
  if (world == 2) c.from = "tp=2", c.to = "dp=2";
  SwitchRequest req = MakeRequest(c, DType::kBF16, 8192);
  auto plan = MakeSwitchPlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto shared = std::make_shared<const SwitchPlan>(std::move(*plan));
  GlobalValues values(TestSeed());
  auto from = ReferenceLayout(req.spec, req.from, world, req.contents, values);
  auto want = ReferenceLayout(req.spec, req.to, world, req.contents, values);
  std::vector<ncclComm_t> comms(world);
  std::vector<int> devs(world);
  for (int r = 0; r < world; ++r) devs[r] = r;
  NCCL_OK(ncclCommInitAll(comms.data(), world, devs.data()));
  std::vector<std::unique_ptr<DeviceRanks>> a(world), b(world);
  std::vector<Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      a[r] = std::make_unique<DeviceRanks>();
      b[r] = std::make_unique<DeviceRanks>();
      a[r]->Upload({from[r]});
      b[r]->Upload(Filled({want[r]}));
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      auto runner = CudaSwitchRunner::Create(shared, r);
      results[r] = runner.ok() ? (*runner)->Run(a[r]->Const()[0], b[r]->bufs[0], stream, comms[r]) : runner.status();
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
    cudaSetDevice(r);
    auto got = b[r]->Download(Filled({want[r]}));
    for (size_t i = 0; i < want[r].data.size(); ++i) {
      ASSERT_TRUE(got[0].data[i] == want[r].data[i]) << "rank " << r << " " << want[r].names[i];
    }
    a[r].reset();
    b[r].reset();
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

}  // namespace
}  // namespace ptc::transform::device
#endif  // PTCFS_WITH_CUDA

int main(int argc, char** argv) {
  std::string why;
  if (!ptc::transform::device::CudaDevicePresent(&why)) {
    std::printf("SKIPPED: switch_cuda_test needs a CUDA device: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
