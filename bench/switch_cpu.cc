// switch_cpu_bench: the CPU executor's switch time per layout pair (run by
// bench/switch.sh, which writes the table into bench/RESULTS.md).
//
// Every rank of both layouts in this process (threads over the in-process
// transport), parameters and gradients in bf16, buffers filled once; per
// pair the median of --runs switches (the plan made once, outside the timing,
// as a job caches it) and what moved. Prints a Markdown table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ptc/model/schema.h"
#include "transform/device/cpu_executor.h"
#include "transform/device/switch_plan.h"

int main(int argc, char** argv) {
  int runs = 5;
  std::string dims = "layers=4,hidden=1024,heads=16,vocab=16000,seq=4096,ffn=2816";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dims")) dims = argv[i + 1];
  }
  // HotSPa's 7B strategies on 8 GPUs and the moves between them (dp, tp, pp).
  const std::vector<std::pair<const char*, const char*>> pairs = {
      {"dp=8", "tp=2,pp=2,dp=2"},         {"tp=2,pp=2,dp=2", "tp=4,pp=2"}, {"tp=4,pp=2", "dp=8"},
      {"dp=8", "tp=4,pp=2"},              {"tp=2,pp=2,dp=2", "dp=8"},      {"tp=4,pp=2", "tp=2,pp=2,dp=2"},
      {"tp=8", "tp=4,pp=2,pp_layers=1+3"}, {"tp=2,dp=4", "tp=4,dp=2"},
  };
  std::printf("| A (switch from) | B (switch to) | moved MB | local MB | buckets | median s | runs | GB/s (moved+local) |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [a, b] : pairs) {
    ptc::transform::device::SwitchRequest req;
    req.spec.schema = *ptc::LoadSchema("llama");
    req.spec.dims = *ptc::ParseDims(dims);
    req.from = *ptc::ParseConfig(a);
    req.to = *ptc::ParseConfig(b);
    req.budget_bytes = 64ull << 20;
    auto plan = ptc::transform::device::MakeSwitchPlan(req);
    if (!plan.ok()) {
      std::fprintf(stderr, "switch_cpu_bench: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    std::vector<std::vector<std::vector<unsigned char>>> fa(plan->world), tb(plan->world);
    std::vector<std::vector<const void*>> from(plan->world);
    std::vector<std::vector<void*>> to(plan->world);
    for (int r = 0; r < plan->world; ++r) {
      for (const auto& t : plan->ranks[r].from)
        fa[r].emplace_back(ptc::transform::device::BufferBytes(t), 1), from[r].push_back(fa[r].back().data());
      for (const auto& t : plan->ranks[r].to)
        tb[r].emplace_back(ptc::transform::device::BufferBytes(t), 0), to[r].push_back(tb[r].back().data());
    }
    std::vector<double> secs;
    for (int i = 0; i < runs; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ptc::Status s = ptc::transform::device::RunSwitchThreads(*plan, from, to);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (!s.ok()) {
        std::fprintf(stderr, "switch_cpu_bench: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    std::sort(secs.begin(), secs.end());
    const double med = secs[secs.size() / 2];
    std::printf("| %s | %s | %.1f | %.1f | %zu | %.3f | %d | %.2f |\n", a, b, plan->bytes_moved / 1e6,
                plan->bytes_local / 1e6, plan->num_buckets, med, runs,
                (plan->bytes_moved + plan->bytes_local) / med / 1e9);
    std::fflush(stdout);
  }
  return 0;
}
