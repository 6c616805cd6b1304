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
#include "transform/layout_manifest.h"
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

struct Args {
  std::string schema = "llama";
  std::string dims = "layers=80,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256,seq=8192";
  std::string from = "tp=8,pp=16,dp=8,per_worker=8";
  std::string to = "tp=8,pp=12,dp=8,per_worker=8,pp_layers=7+7+7+7+7+7+7+7+6+6+6+6";
  bool optimizer = false;
  int reps = 5;
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "plan_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--optimizer") {
      args.optimizer = true;
    } else if (a == "--reps") {
      args.reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--schema") {
      args.schema = next();
    } else if (a == "--dims") {
      args.dims = next();
    } else if (a == "--from") {
      args.from = next();
    } else if (a == "--to") {
      args.to = next();
    } else {
      std::fprintf(stderr, "usage: plan_bench [--optimizer] [--reps N] [--schema S] [--dims D] [--from C] [--to C]\n");
      std::exit(2);
    }
  }
  return args;
}

// Wall and thread CPU seconds of each MakePlan (the planner is single-threaded;
// CPU time does not grow when other tenants of a shared machine take the core).
struct Timed {
  std::vector<double> wall, cpu;
  ptc::transform::Plan plan;
};

Timed TimePlans(const ptc::GenerationManifest& source, const ptc::ModelSpec& spec, const ptc::ParallelConfig& to,
                int reps) {
  Timed out;
  for (int r = 0; r < reps; ++r) {
    ptc::transform::PlanRequest req{&source, spec, to, {}, std::nullopt};
    out.plan = ptc::transform::Plan();
    const double c0 = ThreadCpuSeconds();
    const auto a = std::chrono::steady_clock::now();
    out.plan = Check(ptc::transform::MakePlan(req), "MakePlan");
    const auto b = std::chrono::steady_clock::now();
    out.cpu.push_back(ThreadCpuSeconds() - c0);
    out.wall.push_back(Seconds(a, b));
  }
  return out;
}

void PrintPlan(const Timed& t, const ptc::GenerationManifest& source, bool optimizer) {
  std::vector<double> sorted = t.wall, cpu_sorted = t.cpu;
  std::sort(sorted.begin(), sorted.end());
  std::sort(cpu_sorted.begin(), cpu_sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double cpu_median = cpu_sorted[cpu_sorted.size() / 2];
  const ptc::transform::Plan& plan = t.plan;
  size_t kept = 0, same = 0;
  for (const auto& target : plan.targets) kept += target.kept.has_value(), same += target.same.has_value();
  std::printf("plan      median %.3f s of %zu (min %.3f, max %.3f):", median, t.wall.size(), sorted.front(),
              sorted.back());
  for (double w : t.wall) std::printf(" %.3f", w);
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
      "RESULT optimizer=%d median_s=%.3f min_s=%.3f max_s=%.3f cpu_median_s=%.3f reps=%zu source_shards=%zu targets=%zu "
      "kept=%zu copies=%zu messages=%zu bytes_total=%llu bytes_moved=%llu lower_bound=%llu "
      "bottleneck=%llu peak_rss_mib=%ld\n",
      optimizer ? 1 : 0, median, sorted.front(), sorted.back(), cpu_median, t.wall.size(), source.shards.size(),
      plan.targets.size(), kept, plan.copies.size(), plan.messages.size(),
      static_cast<unsigned long long>(plan.bytes_total), static_cast<unsigned long long>(plan.bytes_moved),
      static_cast<unsigned long long>(plan.lower_bound), static_cast<unsigned long long>(plan.bottleneck),
      PeakRssKiB() / 1024);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  ptc::ModelSpec spec{Check(ptc::LoadSchema(args.schema), "schema"), Check(ptc::ParseDims(args.dims), "dims"),
                      ptc::DType::kBF16, args.optimizer};
  const ptc::ParallelConfig from = Check(ptc::ParseConfig(args.from), "--from");
  const ptc::ParallelConfig to = Check(ptc::ParseConfig(args.to), "--to");

  // The source generation: what `ptcfs import` would record, minus the data.
  const auto t0 = std::chrono::steady_clock::now();
  const ptc::GenerationManifest source =
      Check(ptc::transform::LayoutManifest(Check(ptc::ModelLayout::Make(spec, from), "layout")), "source manifest");
  const auto t1 = std::chrono::steady_clock::now();
  uint64_t source_bytes = 0;
  for (const auto& s : source.shards) source_bytes += s.nbytes;
  std::printf("model     %s %s bf16, optimizer %s\n", args.schema.c_str(), spec.dims.ToString().c_str(),
              args.optimizer ? "adam (f32 exp_avg, exp_avg_sq, fp32)" : "none");
  std::printf("from      %s (%d ranks, %d workers): %zu tensors, %zu stored shards, %s\n", from.ToString().c_str(),
              from.world_size(), from.num_workers(), source.tensors.size(), source.shards.size(),
              Gib(source_bytes).c_str());
  std::printf("to        %s (%d ranks, %d workers)\n", to.ToString().c_str(), to.world_size(), to.num_workers());
  std::printf("manifest  built in %.3f s (not timed below)\n", Seconds(t0, t1));
  PrintPlan(TimePlans(source, spec, to, args.reps), source, args.optimizer);
  return 0;
}
