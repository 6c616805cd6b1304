// shard_hasher_bench: ShardHasher (ptc/base/checksum.h) alone, the commit's
// checksum pass: xxh64 and CRC-32 of every 4 MiB block of 1 GiB of bytes,
// fed in writes of WRITE bytes (the executor appends 1 MiB chunks; a
// verbatim or rank-file write can hand it far more at once). Prints one JSON
// line per write size: {"write":W,"rounds":R,"seconds":[...],"gbps_median":G,
// "cpu_gbps_median":C}: bytes per second of wall time, and per second of this
// process's CPU time (what a loaded machine disturbs least).
// For context, the same bytes through xxh64 alone and CRC-32 alone.
//
//   shard_hasher_bench [ROUNDS] [WRITE...]      (5; 1 MiB, 16 MiB, 64 MiB)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ptc/base/checksum.h"
#include "ptc/base/crc32.h"

namespace {

constexpr size_t kBytes = size_t{1} << 30;

double Seconds(const std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
void Report(const char* what, size_t write, int rounds, Fn fn) {
  std::vector<double> seconds, cpu;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    fn();
    cpu.push_back(CpuSeconds() - c0);
    seconds.push_back(Seconds(t0));
  }
  std::printf("{\"what\":\"%s\",\"write\":%zu,\"rounds\":%d,\"seconds\":[", what, write, rounds);
  for (size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.4f", i ? "," : "", seconds[i]);
  std::printf("],\"gbps_median\":%.3f,\"cpu_gbps_median\":%.3f}\n", kBytes / Median(seconds) / 1e9,
              kBytes / Median(cpu) / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<size_t> writes;
  for (int i = 2; i < argc; ++i) writes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (writes.empty()) writes = {1 << 20, 16 << 20, 64 << 20};
  std::string data(kBytes, '\0');
  uint64_t x = 88172645463325252ULL;
  for (size_t i = 0; i < kBytes; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    for (int b = 0; b < 8; ++b) data[i + b] = static_cast<char>(x >> (8 * b));
  }
  uint64_t sink = 0;
  for (size_t write : writes) {
    Report("ShardHasher", write, rounds, [&] {
      ptc::ShardHasher h;
      for (size_t pos = 0; pos < kBytes; pos += write) h.Update(data.data() + pos, std::min(write, kBytes - pos));
      sink += h.Finish().checksum;
    });
  }
  Report("xxh64 alone", kBytes, rounds, [&] { sink += ptc::Xxh64(data.data(), kBytes); });
  Report("crc32 alone", kBytes, rounds, [&] { sink += ptc::Crc32(0, data.data(), kBytes); });
  return sink == 42 ? 1 : 0;  // keeps the work
}
