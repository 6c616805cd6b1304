// dcp_chunks_bench: the DCP chunk check (ptc::dcp::CheckChunksDisjoint, issue
// 41 item 6) against the number of chunks of one tensor, one core, median of
// --runs runs (default 5), beside the pairwise check it replaced (every chunk
// against every earlier one; one run, up to --pairwise-max chunks). Prints a
// Markdown table; bench/dcp_chunks.sh writes it into bench/RESULTS.md.
//
//   dcp_chunks_bench [--runs N] [--sizes 1000,10000,100000] [--pairwise-max 32768]
//
// Layouts of n chunks: rows (n row blocks of [n, 8]), columns (n column blocks
// of [8, n]), grid (a sqrt(n) x sqrt(n) grid), and empty (n - 1 empty chunks
// beside one whole chunk, each at its own offset).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ptc/checkpoint/dcp/read.h"

namespace {

using Clock = std::chrono::steady_clock;
using ptc::Box;
using ptc::Index;
using ptc::dcp::SavedChunk;
using ptc::dcp::SavedTensor;

double Seconds(const std::function<bool()>& fn) {
  const auto start = Clock::now();
  if (!fn()) {
    std::fprintf(stderr, "dcp_chunks_bench: the check refused a layout that tiles\n");
    std::exit(1);
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(int runs, const std::function<bool()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) t.push_back(Seconds(fn));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

SavedTensor Layout(const std::string& kind, Index n) {
  SavedTensor t;
  t.key = "w";
  auto add = [&](Box box) { t.chunks.push_back(SavedChunk{std::move(box), "__0_0.distcp", 0, 0}); };
  if (kind == "rows") {
    t.shape = {n, 8};
    for (Index i = 0; i < n; ++i) add(Box{{i, 0}, {i + 1, 8}});
  } else if (kind == "columns") {
    t.shape = {8, n};
    for (Index i = 0; i < n; ++i) add(Box{{0, i}, {8, i + 1}});
  } else if (kind == "grid") {
    const auto side = static_cast<Index>(std::llround(std::sqrt(static_cast<double>(n))));
    t.shape = {side, side};
    for (Index r = 0; r < side; ++r) {
      for (Index c = 0; c < side; ++c) add(Box{{r, c}, {r + 1, c + 1}});
    }
  } else {  // empty
    t.shape = {n, 8};
    add(Box{{0, 0}, {n, 8}});
    for (Index i = 1; i < n; ++i) add(Box{{i, 1}, {i, 1}});
  }
  return t;
}

// The check before issue 41: every chunk against every earlier one.
bool Pairwise(const SavedTensor& t) {
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (ptc::Intersect(t.chunks[i].box, t.chunks[j].box)) return false;
    }
  }
  return true;
}

std::string Time(double s) {
  char text[32];
  if (s < 1e-3) {
    std::snprintf(text, sizeof text, "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(text, sizeof text, "%.1f ms", s * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.1f s", s);
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  Index pairwise_max = 32768;
  std::vector<Index> sizes = {1000, 10000, 100000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (flag == "--pairwise-max") {
      pairwise_max = std::atoll(argv[i + 1]);
    } else if (flag == "--sizes") {
      sizes.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::atoll(item.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--sizes A,B,...] [--pairwise-max N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("| chunks | layout | check (median of %d) | pairwise, as before (one run) |\n|---|---|---|---|\n", runs);
  for (Index n : sizes) {
    for (const char* kind : {"rows", "columns", "grid", "empty"}) {
      const SavedTensor t = Layout(kind, n);
      const double sweep = Median(runs, [&] { return ptc::dcp::CheckChunksDisjoint(t, "bench").ok(); });
      const std::string pairwise =
          static_cast<Index>(t.chunks.size()) <= pairwise_max ? Time(Seconds([&] { return Pairwise(t); })) : "-";
      std::printf("| %zu | %s | %s | %s |\n", t.chunks.size(), kind, Time(sweep).c_str(), pairwise.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
