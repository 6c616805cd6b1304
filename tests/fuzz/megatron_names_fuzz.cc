// libFuzzer entry point for Megatron's names (ptc/checkpoint/megatron): a rank
// directory's name (mp_rank_TT[_PPP][_EEE]) and a parameter's name in both of
// Megatron-Core's name sets (fused norms, routed experts). None may crash; a
// directory name that parses renders back to itself in each reading that
// resolves it; a name set's registration order is a permutation, and a
// routed expert's TEGroupedMLP name carries its index at the end.
// Input: lines; the first is tried as a directory name, all as parameter names.
// Run: ./megatron_names_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/megatron_names_fuzz
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/names.h"

namespace {

void CheckRankDir(const std::string& name) {
  auto d = ptc::megatron::ParseRankDirName(name);
  if (!d.ok()) return;
  if (d->tp_rank < 0 || (d->ep_rank >= 0 && d->pp_rank < 0)) __builtin_trap();
  bool resolved = false;
  for (const bool with_pp : {false, true}) {
    for (const bool with_ep : {false, true}) {
      const auto at = ptc::megatron::ResolveRankDir(*d, with_pp, with_ep);
      if (!at) continue;
      resolved = true;
      const auto& [tp, pp, ep] = *at;
      if (ptc::megatron::RankDirName(tp, pp, with_pp ? 2 : 1, ep, with_ep ? 2 : 1) != name) __builtin_trap();
    }
  }
  if (!resolved) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  for (size_t start = 0; start <= input.size();) {
    const size_t end = std::min(input.find('\n', start), input.size());
    lines.push_back(input.substr(start, end - start));
    start = end + 1;
  }
  CheckRankDir(lines.front());
  for (const auto names : {ptc::megatron::NameSet::kTe, ptc::megatron::NameSet::kLocal}) {
    std::vector<size_t> order = ptc::megatron::RegistrationOrder(names, lines);
    std::sort(order.begin(), order.end());
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] != i) __builtin_trap();
    }
  }
  for (const std::string& line : lines) {
    const std::string te = ptc::megatron::NameIn(ptc::megatron::NameSet::kTe, line);
    const size_t at = line.find(".mlp.experts.local_experts.");
    if (te != line && at == std::string::npos) __builtin_trap();  // only experts change in te
    if (te != line) {
      const size_t k = at + std::string_view(".mlp.experts.local_experts.").size();
      const std::string index = line.substr(k, line.find('.', k) - k);
      if (!te.ends_with(index) || te.size() != line.size() - std::string_view("local_experts..").size()) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
