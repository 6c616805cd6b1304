// transform_chunk_bench: `ptcfs transform` with a chosen executor chunk size,
// to measure how ExecuteOptions::chunk_bytes affects a tp change. Diagnostic
// only (bench/transform.sh does not run it).
//
//   transform_chunk_bench STORE TARGET_CONFIG CHUNK_BYTES [THREADS]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ptc/base/env.h"
#include "ptc/store/store.h"
#include "transform/execute.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: transform_chunk_bench STORE TARGET_CONFIG CHUNK_BYTES [THREADS]\n");
    return 2;
  }
  auto target = ptc::ParseConfig(argv[2]);
  auto store = ptc::Store::Open(ptc::Env::Default(), argv[1]);
  if (!target.ok() || !store.ok()) {
    std::fprintf(stderr, "bad config or store\n");
    return 1;
  }
  ptc::transform::ExecuteOptions options;
  options.chunk_bytes = std::strtoull(argv[3], nullptr, 0);
  if (argc > 4) options.threads = std::atoi(argv[4]);
  const auto a = std::chrono::steady_clock::now();
  auto r = ptc::transform::Transform(**store, *target, options);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("chunk %llu threads %d: %.2f s, %llu bytes written\n",
              static_cast<unsigned long long>(options.chunk_bytes), options.threads, s,
              static_cast<unsigned long long>(r->bytes_written));
  return 0;
}
