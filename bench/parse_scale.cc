// parse_scale_bench: parsing time against the number of keys and tensors
// (issue 24 item 5), one core, median of --runs runs (default 5). Prints a
// Markdown table; bench/parse_scale.sh writes it into bench/RESULTS.md.
//
//   parse_scale_bench [--runs N] [--sizes 1000,10000,100000]
//
// For each size n:
//   header parse   ParseSafetensorsHeader of a header of n one-element tensors
//   header encode  EncodeSafetensorsHeader of n tensor specs (a writer's first step)
//   schema expand  a schema of ten rules "layers.{i}.wR" over n/10 layers: ParseSchema
//                  of its JSON, GlobalTensors and the view of the one rank
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/format/safetensors.h"
#include "ptc/model/schema.h"
#include "ptc/model/view.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `runs` calls of fn; fn returns false on failure.
double Median(int runs, const std::function<bool()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto start = Clock::now();
    if (!fn()) {
      std::fprintf(stderr, "parse_scale_bench: a run failed\n");
      std::exit(1);
    }
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string HeaderPrefix(int n) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (int i = 0; i < n; ++i) {
    json += ",\"model.layers." + std::to_string(i) + ".w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
            std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  json += "}";
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((json.size() >> (8 * b)) & 0xff);
  return out + json;
}

std::string Ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), seconds < 0.01 ? "%.2f ms" : "%.0f ms", seconds * 1e3);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  std::vector<int> sizes = {1000, 10000, 100000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (flag == "--sizes") {
      sizes.clear();
      std::stringstream in(argv[i + 1]);
      for (std::string s; std::getline(in, s, ',');) sizes.push_back(std::stoi(s));
    } else {
      std::fprintf(stderr, "usage: parse_scale_bench [--runs N] [--sizes a,b,c]\n");
      return 2;
    }
  }
  std::printf("| keys / tensors | header bytes | header parse | header encode | schema expand (%s) |\n",
              "parse, GlobalTensors, ModelLayout::View");
  std::printf("|---|---|---|---|---|\n");
  for (int n : sizes) {
    const std::string prefix = HeaderPrefix(n);
    const double parse = Median(runs, [&] {
      auto h = ptc::ParseSafetensorsHeader("bench", prefix, prefix.size() + 4ull * n);
      return h.ok() && h->tensors.size() == static_cast<size_t>(n);
    });
    std::vector<ptc::TensorSpec> specs;
    for (int i = 0; i < n; ++i) specs.push_back({"model.layers." + std::to_string(i) + ".w", ptc::DType::kF32, {1}});
    const double encode = Median(runs, [&] { return ptc::EncodeSafetensorsHeader(specs, {{"format", "pt"}}).ok(); });
    // Ten rules over n/10 layers: the layer count stays under its limit (ptc/model/limits.h).
    nlohmann::json doc = {{"name", "wide"}, {"tensors", nlohmann::json::array()}};
    for (int r = 0; r < 10; ++r)
      doc["tensors"].push_back({{"name", "layers.{i}.w" + std::to_string(r)}, {"shape", {1}}, {"pp", "layer"}});
    ptc::ModelSpec spec;
    spec.dims = *ptc::ParseDims("layers=" + std::to_string(n / 10) + ",hidden=8,heads=1,vocab=8,seq=8");
    const ptc::ParallelConfig config = *ptc::ParseConfig("tp=1,pp=1,dp=1");
    const double expand = Median(runs, [&] {
      auto schema = ptc::ParseSchema("wide", doc);
      if (!schema.ok()) return false;
      spec.schema = *schema;
      auto globals = ptc::GlobalTensors(spec);
      auto layout = ptc::ModelLayout::Make(spec, config);
      auto view = layout.ok() ? layout->View(0) : ptc::Result<ptc::RankView>(layout.status());
      return globals.ok() && view.ok() && view->model.size() == static_cast<size_t>(n);
    });
    std::printf("| %d | %zu | %s | %s | %s |\n", n, prefix.size(), Ms(parse).c_str(), Ms(encode).c_str(),
                Ms(expand).c_str());
  }
  return 0;
}
