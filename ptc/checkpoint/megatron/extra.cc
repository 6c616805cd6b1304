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

bool IsNumber(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The heads of a local and a global name up to their first differing
// component when both are numbers (the layer: "decoder.layers.1",
// "decoder.layers.3"); empty when they first differ elsewhere or not at all.
// For names whose tails differ too (TEGroupedMLP's "linear_fc1.weight0" is
// SequentialMLP's "local_experts.K.linear_fc1.weight" in the store).
std::pair<std::string, std::string> NumberHeads(std::string_view local, std::string_view global) {
  const auto l = Components(local), g = Components(global);
  size_t n = 0;
  while (n < l.size() && n < g.size() && l[n] == g[n]) ++n;
  if (n == l.size() || n == g.size() || !IsNumber(l[n]) || !IsNumber(g[n])) return {};
  const auto head = [&](std::string_view name, std::string_view last) {
    return std::string(name.substr(0, static_cast<size_t>(last.data() - name.data()) + last.size()));
  };
  return {head(local, l[n]), head(global, g[n])};
}

bool HasHead(std::string_view key, const std::string& head) { return !head.empty() && key.starts_with(head + "."); }

// `key` with the head `from` replaced by `to` (unchanged when it does not start with it).
std::string Rehead(std::string_view key, const std::string& from, const std::string& to) {
  if (!HasHead(key, from)) return std::string(key);
  return to + std::string(key.substr(from.size()));
}

// The heads that rename `key` between tensor `local` and its global name
// `global` (`key` on the side of `from_local`): their differing heads
// (Heads), else their leading ones up to a differing number (NumberHeads).
std::pair<std::string, std::string> KeyHeads(std::string_view key, std::string_view local, std::string_view global,
                                             bool from_local) {
  auto heads = Heads(local, global);
  if (HasHead(key, from_local ? heads.first : heads.second)) return heads;
  return NumberHeads(local, global);
}

// The global expert of a routed expert's tensor ("...local_experts.K...."), -1 for another.
int ExpertOf(std::string_view name, std::string* without = nullptr) {
  const auto c = Components(name);
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    if (c[i] != "local_experts" || !IsNumber(c[i + 1]) || c[i + 1].size() > 6) continue;
    if (without != nullptr) {
      const size_t at = c[i + 1].data() - name.data();
      *without = std::string(name.substr(0, at)) + "*" + std::string(name.substr(at + c[i + 1].size()));
    }
    return std::stoi(std::string(c[i + 1]));
  }
  return -1;
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
  const auto [local_head, global_head] = KeyHeads(local_key, t.name, global, /*from_local=*/true);
  return {Rehead(local_key, local_head, global_head), global};
}

namespace {

std::string GlobalOf(const LocalTensor& t) { return t.segments.empty() ? t.name : t.segments[0].tensor; }

// The entries of modules that hold several routed experts (TEGroupedMLP's
// linear_fc1/linear_fc2: a key that names no expert, anchored at the saving
// ep rank's first expert) that `view` renders, each at the rank's first expert
// of the anchor's tensor: of the entries of one key, the saved rank's that held
// that expert (the greatest anchor expert not above it; else the least).
std::map<const ExtraEntry*, size_t> GroupedAnchors(const MegatronState& state, const RankView& view, int tp) {
  struct First {
    size_t index = 0;
    int expert = 0;
  };
  std::map<std::string, First> firsts;  // an expert's tensor with "*" for the expert -> the rank's first
  for (size_t i = 0; i < view.model.size(); ++i) {
    std::string free;
    const int x = ExpertOf(GlobalOf(view.model[i]), &free);
    if (x < 0) continue;
    const auto [it, fresh] = firsts.emplace(free, First{i, x});
    if (!fresh && x < it->second.expert) it->second = First{i, x};
  }
  std::map<std::pair<std::string, std::string>, const ExtraEntry*> chosen;  // (key, free anchor) -> entry
  for (const ExtraEntry& e : state.extra) {
    std::string free;
    const int a = ExpertOf(e.anchor, &free);
    const auto f = firsts.find(free);
    if (e.tp != tp || a < 0 || ExpertOf(e.key) >= 0 || f == firsts.end()) continue;
    const auto score = [&](const ExtraEntry* x) {
      const int k = ExpertOf(x->anchor);
      return k <= f->second.expert ? std::pair(1, k) : std::pair(0, -k);
    };
    const ExtraEntry*& c = chosen[{e.key, free}];
    if (c == nullptr || score(&e) > score(c)) c = &e;
  }
  std::map<const ExtraEntry*, size_t> out;
  for (const auto& [key, e] : chosen) {
    std::string free;
    ExpertOf(e->anchor, &free);
    out[e] = firsts.at(free).index;
  }
  return out;
}

}  // namespace

std::vector<PlacedExtra> PlaceExtras(const MegatronState& state, const RankView& view) {
  std::vector<PlacedExtra> out;
  if (state.extra.empty() || state.extra_tp <= 0 || view.model.empty()) return out;
  std::map<std::string, size_t> held;  // global name -> index in view.model
  for (size_t i = 0; i < view.model.size(); ++i) held.emplace(GlobalOf(view.model[i]), i);
  const int tp = view.coords.tp % state.extra_tp;
  const std::map<const ExtraEntry*, size_t> grouped = GroupedAnchors(state, view, tp);
  std::set<std::string> seen;
  std::vector<size_t> lead;  // of each entry of `out`: the components it shares with its module's tensors
  for (const ExtraEntry& e : state.extra) {
    if (e.tp != tp) continue;
    size_t at = 0;
    if (const auto g = grouped.find(&e); g != grouped.end()) {
      at = g->second;
    } else if (const auto it = held.find(e.anchor); it != held.end() && ExpertOf(e.key) == ExpertOf(e.anchor)) {
      at = it->second;
    } else {
      continue;
    }
    const LocalTensor& t = view.model[at];
    const auto [local_head, global_head] = KeyHeads(e.key, t.name, GlobalOf(t), /*from_local=*/false);
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
