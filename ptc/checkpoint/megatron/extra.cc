#include "ptc/checkpoint/megatron/extra.h"

#include <algorithm>
#include <map>
#include <set>

namespace ptc::megatron {
namespace {

std::vector<std::string_view> Components(std::string_view name) {
  std::vector<std::string_view> out;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    out.push_back(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

size_t CommonLead(std::string_view a, std::string_view b) {
  const auto x = Components(a), y = Components(b);
  size_t n = 0;
  while (n < x.size() && n < y.size() && x[n] == y[n]) ++n;
  return n;
}

// The heads of a local and a global name that differ: both without their
// common trailing components ("decoder.layers.1", "decoder.layers.3" for
// layer 1 of the second stage); empty when the names are equal.
std::pair<std::string, std::string> Heads(std::string_view local, std::string_view global) {
  const auto l = Components(local), g = Components(global);
  size_t common = 0;
  while (common < l.size() && common < g.size() && l[l.size() - 1 - common] == g[g.size() - 1 - common]) ++common;
  auto join = [](const std::vector<std::string_view>& parts, size_t n) {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) out.push_back('.');
      out.append(parts[i]);
    }
    return out;
  };
  return {join(l, l.size() - common), join(g, g.size() - common)};
}

// `key` with the head `from` replaced by `to` (unchanged when it does not start with it).
std::string Rehead(std::string_view key, const std::string& from, const std::string& to) {
  if (from.empty() || !key.starts_with(from + ".")) return std::string(key);
  return to + std::string(key.substr(from.size()));
}

// The tensor of `view` sharing the most leading components with `key` (the first of them).
size_t Nearest(const RankView& view, std::string_view key) {
  size_t best = 0, best_n = 0;
  for (size_t i = 0; i < view.model.size(); ++i) {
    const size_t n = CommonLead(view.model[i].name, key);
    if (n > best_n) best = i, best_n = n;
  }
  return best;
}

}  // namespace

bool IsExtraStateKey(std::string_view key) {
  constexpr std::string_view kSuffix = "_extra_state";
  return key == kSuffix || key.ends_with(std::string(".") + std::string(kSuffix));
}

ExtraName GlobalExtraName(const RankView& view, std::string_view local_key) {
  const LocalTensor& t = view.model[Nearest(view, local_key)];
  const std::string& global = t.segments.empty() ? t.name : t.segments[0].tensor;
  const auto [local_head, global_head] = Heads(t.name, global);
  return {Rehead(local_key, local_head, global_head), global};
}

std::vector<PlacedExtra> PlaceExtras(const MegatronState& state, const RankView& view) {
  std::vector<PlacedExtra> out;
  if (state.extra.empty() || state.extra_tp <= 0 || view.model.empty()) return out;
  std::map<std::string, size_t> held;  // global name -> index in view.model
  for (size_t i = 0; i < view.model.size(); ++i) {
    const LocalTensor& t = view.model[i];
    held.emplace(t.segments.empty() ? t.name : t.segments[0].tensor, i);
  }
  std::set<std::string> seen;
  std::vector<size_t> lead;  // of each entry of `out`: the components it shares with its module's tensors
  const int tp = view.coords.tp % state.extra_tp;
  for (const ExtraEntry& e : state.extra) {
    const auto it = held.find(e.anchor);
    if (e.tp != tp || it == held.end()) continue;
    const auto [local_head, global_head] = Heads(view.model[it->second].name, e.anchor);
    std::string local = Rehead(e.key, global_head, local_head);
    if (!seen.insert(local).second) continue;
    // After the last tensor of the nearest module: where torch's state_dict() puts a
    // module's extra state (after its parameters and buffers).
    const size_t near = CommonLead(view.model[Nearest(view, local)].name, local);
    size_t after = 0;
    for (size_t i = 0; i < view.model.size(); ++i) {
      if (CommonLead(view.model[i].name, local) == near) after = i;
    }
    out.push_back({std::move(local), after, &e});
    lead.push_back(near);
  }
  // Among the entries after one tensor, the entry of that tensor's own module first.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out[a].after != out[b].after ? out[a].after < out[b].after : lead[a] > lead[b];
  });
  std::vector<PlacedExtra> sorted;
  for (size_t i : order) sorted.push_back(std::move(out[i]));
  return sorted;
}

}  // namespace ptc::megatron
