// ptcfs strategies: the (dp, tp, pp) each sequence-length group trains in, the
// order of the layout switches in an iteration, and the predicted time per
// iteration against the best single strategy (transform/device/cost_model.h;
// the assumptions are in docs/switching.md).
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/env.h"
#include "ptc/dataset/idx.h"
#include "ptc/dataset/order.h"
#include "ptc/model/schema.h"
#include "tools/commands.h"
#include "transform/device/cost_model.h"

namespace ptcfs {
namespace {

struct StrategiesArgs {
  std::string schema = "llama", dims, buckets, shares, source, fixed;
  double global_batch = 256, memory_gb = 141, tflops = 989, link_gbs = 450;
  ptc::transform::device::Hardware hw;
  bool json = false;
};

ptc::Result<std::vector<double>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    if (part.empty() || *end != '\0' || !(v >= 0)) {
      return ptc::InvalidArgumentError(flag + ": '" + part + "' is not a non-negative number");
    }
    out.push_back(v);
  }
  return out;
}

// Buckets from a Megatron dataset's sequence lengths: shares, mean and mean square per bucket.
ptc::Result<std::vector<ptc::transform::device::LengthBucket>> BucketsFromSource(const std::string& prefix,
                                                                                 const std::vector<uint64_t>& bounds,
                                                                                 double batch) {
  ptc::Env* env = ptc::Env::Default();
  PTC_ASSIGN_OR_RETURN(auto bin, env->OpenRead(prefix + ".bin"));
  PTC_ASSIGN_OR_RETURN(auto idx, ptc::IdxFile::Open(env, prefix + ".idx", bin->Size()));
  const ptc::IdxView& v = idx->view();
  std::vector<ptc::transform::device::LengthBucket> out(bounds.size());
  std::vector<double> count(bounds.size(), 0), sum(bounds.size(), 0), sq(bounds.size(), 0);
  uint64_t longer = 0;
  for (uint64_t i = 0; i < v.num_sequences(); ++i) {
    const uint64_t len = static_cast<uint64_t>(v.length(i));
    if (len > bounds.back()) {
      ++longer;
      continue;
    }
    const size_t g = ptc::GroupOf(bounds, len);
    count[g] += 1, sum[g] += len, sq[g] += static_cast<double>(len) * len;
  }
  const double total = v.num_sequences() - longer;
  if (total == 0) return ptc::InvalidArgumentError(prefix + ".idx: no sequence within the buckets");
  for (size_t g = 0; g < bounds.size(); ++g) {
    out[g].max_len = bounds[g];
    out[g].sequences = batch * count[g] / total;
    out[g].mean_len = count[g] ? sum[g] / count[g] : 0;
    out[g].mean_sq_len = count[g] ? sq[g] / count[g] : 0;
  }
  if (longer) std::fprintf(stderr, "ptcfs strategies: %llu sequences longer than the last bucket left out\n",
                           static_cast<unsigned long long>(longer));
  return out;
}

std::string Triple(const ptc::ParallelConfig& c) {
  return "(" + std::to_string(c.dp) + "," + std::to_string(c.tp) + "," + std::to_string(c.pp) + ")";
}

ptc::Status Run(StrategiesArgs a) {
  ptc::ModelSpec spec;
  PTC_ASSIGN_OR_RETURN(spec.schema, ptc::LoadSchema(a.schema));
  PTC_ASSIGN_OR_RETURN(spec.dims, ptc::ParseDims(a.dims), "--dims");
  std::vector<uint64_t> bounds;
  PTC_ASSIGN_OR_RETURN(std::vector<double> raw, ParseList("--buckets", a.buckets));
  for (double b : raw) bounds.push_back(static_cast<uint64_t>(b));
  PTC_RETURN_IF_ERROR(ptc::CheckLengthBounds(bounds), "--buckets");
  if (bounds.empty()) return ptc::InvalidArgumentError("--buckets: give the length bounds, e.g. 2048,8192,32768");
  std::vector<ptc::transform::device::LengthBucket> buckets;
  if (!a.source.empty()) {
    PTC_ASSIGN_OR_RETURN(buckets, BucketsFromSource(a.source, bounds, a.global_batch));
  } else {
    PTC_ASSIGN_OR_RETURN(std::vector<double> shares, ParseList("--shares", a.shares));
    if (shares.size() != bounds.size()) {
      return ptc::InvalidArgumentError("--shares: " + std::to_string(shares.size()) + " shares for " +
                                       std::to_string(bounds.size()) + " buckets (or give --source)");
    }
    double total = 0;
    for (double s : shares) total += s;
    if (total <= 0) return ptc::InvalidArgumentError("--shares: they sum to 0");
    for (double& s : shares) s /= total;
    buckets = ptc::transform::device::UniformBuckets(bounds, shares, a.global_batch);
  }
  a.hw.memory_bytes = a.memory_gb * 1e9;
  a.hw.peak_flops = a.tflops * 1e12;
  a.hw.link_bytes_per_s = a.link_gbs * 1e9;
  PTC_ASSIGN_OR_RETURN(ptc::transform::device::ModelStats stats, ptc::transform::device::StatsOf(spec));
  std::optional<ptc::ParallelConfig> fixed;
  if (!a.fixed.empty()) {
    PTC_ASSIGN_OR_RETURN(fixed, ptc::ParseConfig(a.fixed), "--fixed");
  }
  PTC_ASSIGN_OR_RETURN(ptc::transform::device::StrategyReport r,
                       ptc::transform::device::PlanStrategies(spec, a.hw, buckets, fixed ? &*fixed : nullptr));
  if (a.json) {
    nlohmann::json j;
    for (size_t i = 0; i < buckets.size(); ++i) {
      j["buckets"].push_back({{"max_len", buckets[i].max_len},
                              {"sequences", buckets[i].sequences},
                              {"strategy", r.chosen[i].ToString()},
                              {"memory_gb", r.chosen_estimate[i].memory_bytes / 1e9},
                              {"seconds", r.chosen_estimate[i].seconds},
                              {"fixed_seconds", r.fixed_estimate[i].seconds}});
    }
    for (const auto& s : r.switches) {
      j["switches"].push_back({{"from", s.from.ToString()}, {"to", s.to.ToString()}, {"bytes", s.bytes}, {"seconds", s.seconds}});
    }
    j["order"] = r.order;
    j["base"] = r.base.ToString();
    j["fixed"] = r.fixed.ToString();
    j["switching_seconds"] = r.switching_seconds;
    j["fixed_seconds"] = r.fixed_seconds;
    j["speedup"] = r.speedup();
    std::printf("%s\n", j.dump(2).c_str());
    return ptc::Status::OK();
  }
  std::printf("model     %s %s: %.2f B parameters\n", spec.schema.name.c_str(), spec.dims.ToString().c_str(),
              stats.params / 1e9);
  std::printf("hardware  %d GPUs (%d per node), %.0f GB each, %.0f TFLOP/s at %.0f%% MFU, link %.0f GB/s\n", a.hw.gpus,
              a.hw.gpus_per_node, a.memory_gb, a.tflops, a.hw.mfu * 100, a.link_gbs);
  std::printf("batch     %.0f sequences\n\n", a.global_batch);
  std::printf("%-10s %9s %9s   %-12s %9s %9s   %-12s %9s\n", "bucket", "seqs", "mean len", "(dp,tp,pp)", "mem GB",
              "time s", "fixed", "time s");
  for (size_t i = 0; i < buckets.size(); ++i) {
    std::printf("<= %-7llu %9.1f %9.0f   %-12s %9.1f %9.3f   %-12s %9.3f\n",
                static_cast<unsigned long long>(buckets[i].max_len), buckets[i].sequences, buckets[i].mean_len,
                Triple(r.chosen[i]).c_str(), r.chosen_estimate[i].memory_bytes / 1e9, r.chosen_estimate[i].seconds,
                Triple(r.fixed).c_str(), r.fixed_estimate[i].seconds);
  }
  std::printf("\norder     base %s", Triple(r.base).c_str());
  for (size_t g : r.order) std::printf(" -> <=%llu %s", static_cast<unsigned long long>(buckets[g].max_len), Triple(r.chosen[g]).c_str());
  std::printf(" -> base\n");
  double switch_time = 0;
  for (const auto& s : r.switches) {
    std::printf("switch    %s -> %s: %.0f MB on the busiest rank, %.1f ms\n", Triple(s.from).c_str(),
                Triple(s.to).c_str(), s.bytes / 1e6, s.seconds * 1e3);
    switch_time += s.seconds;
  }
  std::printf("\nper iteration  switching %.3f s (switches %.3f s, gradient sync %.3f s)\n", r.switching_seconds,
              switch_time, r.grad_sync_seconds);
  std::printf("               fixed %s %.3f s\n", Triple(r.fixed).c_str(), r.fixed_seconds);
  std::printf("predicted speedup %.2fx\n", r.speedup());
  return ptc::Status::OK();
}

}  // namespace

void AddStrategiesCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<StrategiesArgs>();
  CLI::App* sub = app.add_subcommand(
      "strategies",
      "Per sequence-length group, the parallel layout (dp, tp, pp) to train in, the order of the\n"
      "layout switches in an iteration and the predicted time per iteration against the best single\n"
      "layout (HotSPa's hot switching; model and assumptions in docs/switching.md). Lengths come from\n"
      "a Megatron dataset (--source) or from shares of the global batch per bucket (--shares).");
  sub->add_option("--schema", a->schema, "megatron-gpt, llama (default) or a schema file");
  sub->add_option("--dims", a->dims, "model dims, e.g. layers=32,hidden=4096,heads=32,vocab=32000,seq=32768,ffn=11008")
      ->required();
  sub->add_option("--buckets", a->buckets, "length bounds, ascending, e.g. 2048,4096,8192,16384,32768")->required();
  sub->add_option("--shares", a->shares, "share of the sequences in each bucket, e.g. 50,25,13,8,4");
  sub->add_option("--source", a->source, "a Megatron dataset PREFIX (.bin/.idx) whose lengths give the shares");
  sub->add_option("--global-batch", a->global_batch, "sequences per global batch (default 256)");
  sub->add_option("--gpus", a->hw.gpus, "GPUs (default 8)");
  sub->add_option("--gpus-per-node", a->hw.gpus_per_node, "GPUs per node (default 8): tp stays inside one");
  sub->add_option("--memory-gb", a->memory_gb, "memory per GPU in GB (default 141, H200)");
  sub->add_option("--tflops", a->tflops, "dense bf16 TFLOP/s per GPU (default 989, H100/H200)");
  sub->add_option("--mfu", a->hw.mfu, "fraction of the peak the matmuls reach (default 0.5)");
  sub->add_option("--link-gbs", a->link_gbs, "GB/s per GPU per direction inside a node (default 450, NVLink 4)");
  sub->add_option("--fixed", a->fixed, "the single strategy to compare with, e.g. tp=4,pp=2 (default: the best one)");
  sub->add_flag("--json", a->json, "print JSON");
  sub->callback([a, exit_code] { *exit_code = Report("strategies", Run(*a)); });
}

}  // namespace ptcfs
