// Benchmark of the dataset order and partition functions (ptc/dataset/order.h)
// over a large epoch, with no index file: ids per second (sequential stream
// iteration and random access) and peak RSS, median of --runs runs.
//
//   dataset_order_bench [--samples N] [--global-batch B] [--dp D] [--ids M] [--runs R]
//
// Each run walks every dp rank's stream from the start of the epoch, M / D ids
// per rank (sample id = Permutation(position); M defaults to the whole epoch),
// then does M / 10 random-access lookups (RankSamples::At at random j) in the
// stream of a rank from the middle of the epoch. Prints a Markdown table.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ptc/dataset/order.h"

namespace {

struct Args {
  uint64_t samples = 1'000'000'000;
  uint64_t global_batch = 1024;
  int dp = 8;
  uint64_t ids = 1'000'000'000;
  int runs = 5;
};

bool Parse(int argc, char** argv, Args& a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--samples")
      a.samples = v;
    else if (k == "--global-batch")
      a.global_batch = v;
    else if (k == "--dp")
      a.dp = static_cast<int>(v);
    else if (k == "--ids")
      a.ids = v;
    else if (k == "--runs")
      a.runs = static_cast<int>(v);
    else
      return false;
  }
  return (argc % 2) == 1 && a.samples > 0 && a.global_batch > 0 && a.dp > 0 && a.runs > 0;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

long PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

struct RunResult {
  double stream_ids_per_s, random_ids_per_s;
  uint64_t checksum;
};

RunResult OneRun(const Args& a, uint64_t seed) {
  const ptc::BatchGeometry g{a.samples, a.global_batch};
  const uint64_t consumed = g.num_batches() / 2 * a.global_batch;  // for random access
  const ptc::Permutation perm(a.samples, seed, 0);
  RunResult r{0, 0, 0};
  uint64_t done = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int rank = 0; rank < a.dp; ++rank) {
    ptc::RankStream s = *ptc::RankStream::Create(g, 0, a.dp, rank);
    uint64_t left = std::min<uint64_t>(a.ids / a.dp, s.size());
    for (auto it = s.begin(); left > 0; ++it, --left, ++done) r.checksum += perm(*it);
  }
  r.stream_ids_per_s = done / Seconds(t0);
  ptc::RankSamples samples(perm, *ptc::RankStream::Create(g, consumed, a.dp, a.dp - 1));
  std::mt19937_64 rng(seed);
  const uint64_t lookups = std::max<uint64_t>(std::min(a.ids, a.samples) / 10, 1);
  t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < lookups && samples.size() > 0; ++i) r.checksum += samples.At(rng() % samples.size());
  r.random_ids_per_s = lookups / Seconds(t0);
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!Parse(argc, argv, a)) {
    std::fprintf(stderr, "usage: %s [--samples N] [--global-batch B] [--dp D] [--ids M] [--runs R]\n", argv[0]);
    return 2;
  }
  std::vector<double> stream, random;
  uint64_t checksum = 0;
  for (int i = 0; i < a.runs; ++i) {
    RunResult r = OneRun(a, 1234 + i);
    stream.push_back(r.stream_ids_per_s);
    random.push_back(r.random_ids_per_s);
    checksum ^= r.checksum;
    std::fprintf(stderr, "run %d: stream %.1f M ids/s, random access %.1f M ids/s\n", i + 1, r.stream_ids_per_s / 1e6,
                 r.random_ids_per_s / 1e6);
  }
  std::printf(
      "| samples | global batch | dp | ids per run | stream ids/s (1 core) | random-access ids/s | peak RSS |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %llu | %llu | %d | %llu | %.1f M | %.1f M | %.1f MiB |\n", static_cast<unsigned long long>(a.samples),
              static_cast<unsigned long long>(a.global_batch), a.dp,
              static_cast<unsigned long long>(std::min(a.ids, a.samples)), Median(stream) / 1e6, Median(random) / 1e6,
              PeakRssKiB() / 1024.0);
  std::fprintf(stderr, "(checksum %llx)\n", static_cast<unsigned long long>(checksum));
  return 0;
}
