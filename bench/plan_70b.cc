// plan_bench: how long the planner takes for a big job, on metadata alone.
//
// Builds the source generation manifest a store would hold for a model under
// --from (every stored shard of every worker, with made-up file names, offsets
// and checksums; no tensor data is written or read), then times
// ptc::transform::MakePlan to --to, --reps times, and prints the median, the plan's
// totals and the process's peak RSS. Run it on one core (taskset -c 0).
//
// Default: the 70B Llama of issue 3, tp=8,pp=16,dp=8 (1024 ranks, 128
// workers) -> tp=8,pp=12,dp=8. 80 layers do not split evenly into 12 stages,
// so the target gives pp_layers (eight stages of 7, four of 6).
//
//   plan_bench [--optimizer] [--reps N] [--schema S] [--dims D] [--from C] [--to C]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"
#include "ptc/model/view.h"
#include "ptc/store/manifest.h"
#include "transform/plan.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

long PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;  // KiB on Linux
}

std::string Gib(uint64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / (1ull << 30));
  return buf;
}

template <typename T>
T Check(ptc::Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "plan_bench: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

}  // namespace

int main(int argc, char** argv) {
  std::string schema_name = "llama";
  std::string dims_text = "layers=80,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256,seq=8192";
  std::string from_text = "tp=8,pp=16,dp=8,per_worker=8";
  std::string to_text = "tp=8,pp=12,dp=8,per_worker=8,pp_layers=7+7+7+7+7+7+7+7+6+6+6+6";
  bool optimizer = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "plan_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--optimizer")
      optimizer = true;
    else if (a == "--reps")
      reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--schema")
      schema_name = next();
    else if (a == "--dims")
      dims_text = next();
    else if (a == "--from")
      from_text = next();
    else if (a == "--to")
      to_text = next();
    else {
      std::fprintf(stderr, "usage: plan_bench [--optimizer] [--reps N] [--schema S] [--dims D] [--from C] [--to C]\n");
      return 2;
    }
  }

  ptc::ModelSpec spec{Check(ptc::LoadSchema(schema_name), "schema"), Check(ptc::ParseDims(dims_text), "dims"),
                      ptc::DType::kBF16, optimizer};
  const ptc::ParallelConfig from = Check(ptc::ParseConfig(from_text), "--from");
  const ptc::ParallelConfig to = Check(ptc::ParseConfig(to_text), "--to");

  // The source generation: what `ptcfs import` would record, minus the data.
  const auto t0 = std::chrono::steady_clock::now();
  ptc::GenerationManifest source;
  source.generation = 1;
  source.dims = spec.dims.ToString();
  source.config = from.ToString();
  for (auto& g : Check(ptc::GlobalTensors(spec), "tensors")) {
    source.tensors.push_back({g.name, g.dtype, g.shape});
  }
  std::vector<ptc::DType> dtype_of;  // parallel to keys
  auto keys =
      Check(ptc::transform::TargetShardKeys(Check(ptc::ModelLayout::Make(spec, from), "layout")), "source shards");
  {
    std::vector<std::pair<std::string, ptc::DType>> by_name;
    for (const auto& t : source.tensors) by_name.emplace_back(t.name, t.dtype);
    std::sort(by_name.begin(), by_name.end());
    std::vector<uint64_t> per_worker_files(from.num_workers(), 0);
    std::vector<uint64_t> per_worker_offset(from.num_workers(), 0);
    source.shards.reserve(keys.size());
    for (auto& [key, worker] : keys) {
      auto it = std::lower_bound(by_name.begin(), by_name.end(), std::make_pair(key.tensor, ptc::DType::kF64));
      if (it == by_name.end() || it->first != key.tensor) {
        std::fprintf(stderr, "plan_bench: no global tensor %s\n", key.tensor.c_str());
        return 1;
      }
      uint64_t elems = 0;
      for (const ptc::Box& b : key.boxes) elems += b.volume();
      ptc::ShardRecord r;
      r.tensor = key.tensor;
      r.boxes = key.boxes;
      r.worker = worker;
      char file[96];
      std::snprintf(file, sizeof file, "gen-000001/worker-%04d/shards-%06llu.h5", worker,
                    static_cast<unsigned long long>(per_worker_files[worker]++ / 64));
      r.file = file;
      r.offset = 4096 + per_worker_offset[worker];
      r.nbytes = elems * ptc::DTypeSize(it->second);
      per_worker_offset[worker] += r.nbytes + 2048;
      r.checksum = 0x9e3779b97f4a7c15ull * (source.shards.size() + 1);
      source.shards.push_back(std::move(r));
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  uint64_t source_bytes = 0;
  for (const auto& s : source.shards) source_bytes += s.nbytes;

  std::printf("model     %s %s bf16, optimizer %s\n", schema_name.c_str(), spec.dims.ToString().c_str(),
              optimizer ? "adam (f32 exp_avg, exp_avg_sq, fp32)" : "none");
  std::printf("from      %s (%d ranks, %d workers): %zu tensors, %zu stored shards, %s\n", from.ToString().c_str(),
              from.world_size(), from.num_workers(), source.tensors.size(), source.shards.size(),
              Gib(source_bytes).c_str());
  std::printf("to        %s (%d ranks, %d workers)\n", to.ToString().c_str(), to.world_size(), to.num_workers());
  std::printf("manifest  built in %.3f s (not timed below)\n", Seconds(t0, t1));

  // Wall time, and the thread's CPU time (the planner is single-threaded; CPU
  // time does not grow when other tenants of a shared machine take the core).
  std::vector<double> times, cpu_times;
  ptc::transform::Plan plan;
  for (int r = 0; r < reps; ++r) {
    ptc::transform::PlanRequest req{&source, spec, to, {}, std::nullopt};
    plan = ptc::transform::Plan();
    const double c0 = ThreadCpuSeconds();
    const auto a = std::chrono::steady_clock::now();
    plan = Check(ptc::transform::MakePlan(req), "MakePlan");
    const auto b = std::chrono::steady_clock::now();
    cpu_times.push_back(ThreadCpuSeconds() - c0);
    times.push_back(Seconds(a, b));
  }
  std::vector<double> sorted = times, cpu_sorted = cpu_times;
  std::sort(sorted.begin(), sorted.end());
  std::sort(cpu_sorted.begin(), cpu_sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double cpu_median = cpu_sorted[cpu_sorted.size() / 2];

  size_t kept = 0, same = 0;
  for (const auto& t : plan.targets) kept += t.kept.has_value(), same += t.same.has_value();
  std::printf("plan      median %.3f s of %d (min %.3f, max %.3f):", median, reps, sorted.front(), sorted.back());
  for (double t : times) std::printf(" %.3f", t);
  std::printf("\n");
  std::printf("plan cpu  median %.3f s (min %.3f, max %.3f)\n", cpu_median, cpu_sorted.front(), cpu_sorted.back());
  std::printf("targets   %zu stored shards (%zu kept, %zu identical on another worker), %zu copies, %zu messages\n",
              plan.targets.size(), kept, same, plan.copies.size(), plan.messages.size());
  std::printf("bytes     total %s, kept %s, local %s, moved %s, lower bound %s, bottleneck %s, missing %zu\n",
              Gib(plan.bytes_total).c_str(), Gib(plan.bytes_kept).c_str(), Gib(plan.bytes_local).c_str(),
              Gib(plan.bytes_moved).c_str(), Gib(plan.lower_bound).c_str(), Gib(plan.bottleneck).c_str(),
              plan.missing.size());
  std::printf("peak_rss  %ld MiB\n", PeakRssKiB() / 1024);
  // One machine-readable line for bench/transform.sh.
  std::printf(
      "RESULT optimizer=%d median_s=%.3f min_s=%.3f max_s=%.3f cpu_median_s=%.3f reps=%d source_shards=%zu targets=%zu "
      "kept=%zu copies=%zu messages=%zu bytes_total=%llu bytes_moved=%llu lower_bound=%llu "
      "bottleneck=%llu peak_rss_mib=%ld\n",
      optimizer ? 1 : 0, median, sorted.front(), sorted.back(), cpu_median, reps, source.shards.size(),
      plan.targets.size(), kept, plan.copies.size(), plan.messages.size(),
      static_cast<unsigned long long>(plan.bytes_total), static_cast<unsigned long long>(plan.bytes_moved),
      static_cast<unsigned long long>(plan.lower_bound), static_cast<unsigned long long>(plan.bottleneck),
      PeakRssKiB() / 1024);
  return 0;
}
