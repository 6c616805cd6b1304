// Helpers shared by the tests: seeds, temporary directories, random configs.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "ptc/base/env.h"
#include "ptc/model/config.h"
#include "ptc/model/dtype.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"

namespace ptc::testing {

// True under CI (CI=true), where a test that cannot do what it checks fails
// instead of skipping.
inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string_view(ci) == "true";
}

// A seed from PTCFS_TEST_SEED, else random; printed so a failure can be replayed.
inline uint64_t TestSeed() {
  const char* env = std::getenv("PTCFS_TEST_SEED");
  uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("PTCFS_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ptcfs-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole content of a file ("" when it cannot be read).
// Every dtype, for tests that cover them all.
inline constexpr DType kAllDTypes[] = {DType::kF64, DType::kF32,  DType::kF16,    DType::kBF16,
                                       DType::kI64, DType::kI32,  DType::kI16,    DType::kI8,
                                       DType::kU8,  DType::kBool, DType::kF8E4M3, DType::kF8E5M2};

// Deterministic bytes for tensor number k (tests/clients recompute them in Python).
inline std::string Pattern(int k, DType dtype, uint64_t n) {
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; ++i)
    s[i] = static_cast<char>(dtype == DType::kBool ? (k + i) & 1 : (k * 37 + i * 11 + 5) & 0xff);
  return s;
}

// One random edit of `s` for the mutation tests of the parsers: a bit flip, a
// deletion, an inserted character of `inserts`, or a truncation.
inline void MutateOnce(std::mt19937_64& rng, std::string_view inserts, std::string& s) {
  const size_t at = s.empty() ? 0 : rng() % s.size();
  switch (rng() % 4) {
    case 0:
      if (!s.empty()) s[at] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:
      s.erase(at, 1 + rng() % 4);
      break;
    case 2:
      s.insert(at, 1, inserts[rng() % inserts.size()]);
      break;
    case 3:
      s.resize(at);
      break;
  }
}

inline std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void Spit(const std::filesystem::path& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// Everything under `dir` (relative path -> file content, or "<dir>"), to
// assert that a tree did not change at all.
inline std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    files[std::filesystem::relative(e.path(), dir).string()] = e.is_directory() ? "<dir>" : Slurp(e.path());
  }
  return files;
}

// Whether `text` holds `part` (messages are checked for the names they must carry).
inline bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs a shell command; returns its exit status and stdout+stderr.
inline std::pair<int, std::string> Sh(const std::string& command) {
  FILE* p = popen(("(" + command + ") 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs the ptcfs binary under test with `args`.
inline std::pair<int, std::string> Ptcfs(const std::string& args) { return Sh(std::string(PTCFS_BINARY) + " " + args); }

// Writes `script` to DIR/check.py and runs it with /usr/bin/python3 and `arg`;
// returns (exit status, stdout and stderr).
inline std::pair<int, std::string> RunPythonScript(const std::string& dir, const std::string& script,
                                                   const std::string& arg) {
  const std::string path = dir + "/check.py";
  std::ofstream(path) << script;
  return Sh("/usr/bin/python3 " + path + " " + arg + " 2>&1");
}

inline bool HaveNumpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

// The independent Python reader of a rank's dataset view (tests/clients/
// read_megatron_view.py) over VIEW_DIR against the source SOURCE_PREFIX.
// Its output ends with "READER OK <count>" when the view is right.
inline std::string RunMegatronViewReader(const std::string& source_prefix, const std::string& view_dir) {
  return Sh("/usr/bin/python3 " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/read_megatron_view.py " +
            source_prefix + " " + view_dir)
      .second;
}

// A RandomAccessFile over bytes in memory (parsers' tests read from it).
class StringFile final : public RandomAccessFile {
 public:
  StringFile(std::string data, std::string path) : data_(std::move(data)), path_(std::move(path)) {}
  Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset > data_.size() || n > data_.size() - offset) return CorruptionError(path_ + ": read past the end");
    std::memcpy(dst, data_.data() + offset, n);
    return Status::OK();
  }
  uint64_t Size() const override { return data_.size(); }
  const std::string& path() const override { return path_; }

 private:
  std::string data_;
  std::string path_;
};

// Divisors of n up to `max`.
inline std::vector<int> Divisors(int64_t n, int max) {
  std::vector<int> out;
  for (int d = 1; d <= max; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// A random valid config for spec: tp dividing every split rule, pp even or
// uneven, dp 1-3, zero 0/1 when there is optimizer state, per_worker 1-8.
inline ParallelConfig RandomConfig(std::mt19937_64& rng, const ModelSpec& spec, int max_tp = 4, int max_pp = 4) {
  while (true) {
    ParallelConfig c;
    auto tps = Divisors(spec.dims.kv_heads, max_tp);
    c.tp = tps[rng() % tps.size()];
    c.pp = 1 + rng() % std::min<int64_t>(max_pp, spec.dims.layers);
    c.dp = 1 + rng() % 3;
    c.zero = spec.optimizer ? static_cast<int>(rng() % 2) : 0;
    c.per_worker = 1 + rng() % 8;
    if (spec.dims.layers % c.pp != 0 || rng() % 3 == 0) {
      // Uneven stages: random positive counts summing to layers.
      c.pp_layers.assign(c.pp, 1);
      for (int64_t left = spec.dims.layers - c.pp; left > 0; --left) c.pp_layers[rng() % c.pp]++;
    }
    if (ValidateConfig(spec, c).ok()) return c;
  }
}

inline ModelSpec Spec(const std::string& schema, const std::string& dims, DType dtype = DType::kF32,
                      bool optimizer = false) {
  ModelSpec s;
  s.schema = *LoadSchema(schema);
  s.dims = *ParseDims(dims);
  s.dtype = dtype;
  s.optimizer = optimizer;
  return s;
}

// The layout of (spec, config); a test's configs fit their models (a config
// that does not is a bug in the test, which stops here naming it).
inline ModelLayout FitLayout(const ModelSpec& spec, const ParallelConfig& config) {
  Result<ModelLayout> layout = ModelLayout::Make(spec, config);
  if (!layout.ok()) {
    std::fprintf(stderr, "test bug: %s\n", layout.status().ToString().c_str());
    std::abort();
  }
  return *layout;
}

// The view of `rank` of (spec, config), the config checked first.
inline Result<RankView> LayoutView(const ModelSpec& spec, const ParallelConfig& config, int rank) {
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(spec, config));
  return layout.View(rank);
}

}  // namespace ptc::testing
