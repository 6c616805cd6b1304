#include "ptc/checkpoint/megatron/names.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <tuple>

namespace ptc::megatron {
namespace {

// A fused norm of te names: its suffix there, its suffix in local names, and
// the submodule of its layer it is registered before in local names (else,
// when the layer has none of that, `or_before`).
struct FusedNorm {
  std::string_view te, local, before, or_before = {};
};
constexpr FusedNorm kFused[] = {
    {".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight", ".self_attention."},
    {".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias", ".self_attention."},
    {".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight", ".mlp."},
    {".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias", ".mlp."},
    // MLA (MLASelfAttention): the q and kv norms, built after every linear of the attention,
    // so before the MLP's norm (an MoE layer's own) or the MLP (a dense layer's, fused in te).
    {".self_attention.linear_q_up_proj.layer_norm_weight", ".self_attention.q_layernorm.weight",
     ".pre_mlp_layernorm.", ".mlp."},
    {".self_attention.linear_kv_up_proj.layer_norm_weight", ".self_attention.kv_layernorm.weight",
     ".pre_mlp_layernorm.", ".mlp."},
};

// A routed expert's tensor in the schema's (SequentialMLP's) names,
// "P.mlp.experts.local_experts.K.REST": P.mlp.experts., K and REST
// (linear_fc1.weight, ...). TEGroupedMLP names it "P.mlp.experts.REST" + K.
struct ExpertParts {
  std::string_view head;   // up to and with "experts."
  std::string_view index;  // K
  std::string_view rest;
};
constexpr std::string_view kLocalExperts = ".mlp.experts.local_experts.";

std::optional<ExpertParts> Expert(std::string_view name) {
  const size_t at = name.find(kLocalExperts);
  if (at == std::string_view::npos) return std::nullopt;
  const size_t k = at + kLocalExperts.size(), dot = name.find('.', k);
  if (dot == std::string_view::npos || dot == k || dot + 1 == name.size()) return std::nullopt;
  for (size_t c = k; c < dot; ++c) {
    if (name[c] < '0' || name[c] > '9') return std::nullopt;
  }
  return ExpertParts{name.substr(0, at + std::string_view(".mlp.experts.").size()), name.substr(k, dot - k),
                     name.substr(dot + 1)};
}

// The fused norm `name` (te names) is, and its layer's prefix P; nullopt for another tensor.
std::optional<std::pair<const FusedNorm*, std::string_view>> Fused(std::string_view name) {
  for (const FusedNorm& f : kFused) {
    if (name.size() > f.te.size() && name.ends_with(f.te))
      return std::pair{&f, name.substr(0, name.size() - f.te.size())};
  }
  return std::nullopt;
}

// TEGroupedMLP's order of a layer's routed experts: each of its linears
// registers the weight of every local expert (linear_fc1.weight0, weight1,
// ..., then linear_fc2's), where SequentialMLP registers expert by expert.
// Each run of one layer's expert tensors is reordered by (the rank of REST in
// the run, K); everything else keeps its place.
std::vector<size_t> GroupedExpertOrder(const std::vector<std::string>& order_in) {
  std::vector<std::tuple<size_t, size_t, size_t>> place(order_in.size());
  size_t run_start = 0;
  std::string_view run_head;
  std::vector<std::string_view> rests;  // of the current run, in first appearance
  for (size_t i = 0; i < order_in.size(); ++i) {
    const auto expert = Expert(order_in[i]);
    if (!expert) {
      place[i] = {i, 0, 0};
      run_head = {};
      continue;
    }
    if (expert->head != run_head) {
      run_head = expert->head;
      run_start = i;
      rests.clear();
    }
    size_t r = std::find(rests.begin(), rests.end(), expert->rest) - rests.begin();
    if (r == rests.size()) rests.push_back(expert->rest);
    size_t k = 0;
    std::from_chars(expert->index.data(), expert->index.data() + expert->index.size(), k);
    place[i] = {run_start, 1 + r, k};
  }
  std::vector<size_t> out(order_in.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = i;
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) { return place[a] < place[b]; });
  return out;
}

}  // namespace

Result<NameSet> ParseNameSet(std::string_view text) {
  if (text == "te") return NameSet::kTe;
  if (text == "local") return NameSet::kLocal;
  return InvalidArgumentError("names '" + std::string(text) +
                              "': te (Megatron-Core with Transformer Engine) or local (its local layer spec)");
}

std::string_view NameSetName(NameSet names) {
  switch (names) {
    case NameSet::kTe:
      return "te";
    case NameSet::kLocal:
      return "local";
    case NameSet::kTeSequential:
      break;
  }
  return "te-sequential";
}

std::string NameIn(NameSet names, std::string_view name) {
  if (names == NameSet::kTeSequential) return std::string(name);
  if (names == NameSet::kTe) {
    const auto expert = Expert(name);
    if (!expert) return std::string(name);
    return std::string(expert->head) + std::string(expert->rest) + std::string(expert->index);
  }
  const auto fused = Fused(name);
  if (!fused) return std::string(name);
  return std::string(fused->second) + std::string(fused->first->local);
}

bool IsExpertParameter(const LocalTensor& param) {
  return !param.segments.empty() && Expert(param.segments[0].tensor).has_value();
}

std::vector<size_t> RegistrationOrder(NameSet names, const std::vector<std::string>& te_order) {
  std::vector<size_t> order(te_order.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (names == NameSet::kTeSequential) return order;
  if (names == NameSet::kTe) return GroupedExpertOrder(te_order);
  // Each tensor's place: its own index; a fused norm's, just before the first
  // tensor of the submodule a local model registers it before (its own place
  // when the view has none), norms of one place in their te order.
  std::vector<std::tuple<size_t, int, size_t>> place(te_order.size());
  for (size_t i = 0; i < te_order.size(); ++i) {
    place[i] = {i, 1, i};
    const auto fused = Fused(te_order[i]);
    if (!fused) continue;
    for (std::string_view before : {fused->first->before, fused->first->or_before}) {
      if (before.empty()) break;
      const std::string head = std::string(fused->second) + std::string(before);
      const auto j = std::find_if(te_order.begin(), te_order.end(),
                                  [&head](const std::string& name) { return name.starts_with(head); });
      if (j == te_order.end()) continue;
      place[i] = {static_cast<size_t>(j - te_order.begin()), 0, i};
      break;
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return place[a] < place[b]; });
  return order;
}

Status CheckNameSetSplits(NameSet names, int tp, const RankView& view) {
  if (names != NameSet::kLocal || tp == 1) return Status::OK();
  for (const LocalTensor& t : view.model) {
    if (t.name.ends_with(".self_attention.linear_q_down_proj.weight") ||
        t.name.ends_with(".self_attention.linear_kv_down_proj.weight")) {
      return InvalidArgumentError(
          "tensor " + t.name + ": the local spec's MLASelfAttention splits it over tp=" + std::to_string(tp) +
          " (ColumnParallelLinear) where Transformer Engine's keeps it whole; ptcfs has MLA's local names at tp=1 "
          "only (docs/megatron_format.md)");
    }
  }
  return Status::OK();
}

RankView ViewInNameSet(const RankView& view, NameSet names, std::vector<size_t>* from) {
  std::vector<std::string> te_order;
  for (const LocalTensor& t : view.model) te_order.push_back(t.name);
  const std::vector<size_t> order = RegistrationOrder(names, te_order);
  RankView out = view;
  for (size_t i = 0; i < order.size(); ++i) {
    out.model[i] = view.model[order[i]];
    out.model[i].name = NameIn(names, view.model[order[i]].name);
  }
  for (LocalTensor& t : out.optim) {
    const size_t dot = t.name.rfind('.');  // "P.exp_avg": rename P
    if (dot != std::string::npos) t.name = NameIn(names, std::string_view(t.name).substr(0, dot)) + t.name.substr(dot);
  }
  if (from != nullptr) *from = order;
  return out;
}

Result<NameSet> RecogniseNameSet(const RankView& view, const std::function<bool(const std::string&)>& has,
                                 const std::function<std::string(const std::string&)>& where) {
  // Per kind (0: the fused norms, 1: the routed experts): the set the file names it in (kTe or
  // kLocal) and the file's name of the tensor that decided.
  std::optional<NameSet> found[2];
  std::string decided[2];
  auto label = [](size_t kind, NameSet s) {
    if (kind == 1) return std::string(s == NameSet::kTe ? "TEGroupedMLP's expert names" : "SequentialMLP's expert names");
    return s == NameSet::kTe ? std::string("Transformer Engine's names (te)")
                             : std::string("the local spec's names (local)");
  };
  for (const LocalTensor& t : view.model) {
    const std::string te = NameIn(NameSet::kTe, t.name), local = NameIn(NameSet::kLocal, t.name);
    if (te == local) continue;  // the same in both sets
    const bool in_te = has(te), in_local = has(local);
    if (in_te && in_local) {
      return InvalidArgumentError(where(te) + ": also held as " + where(local) +
                                  " (Transformer Engine's and the local spec's names of one tensor)");
    }
    if (!in_te && !in_local) continue;  // missing: named when the tensors are looked up
    const size_t kind = Expert(t.name) ? 1 : 0;
    const NameSet set = in_te ? NameSet::kTe : NameSet::kLocal;
    const std::string name = in_te ? te : local;
    if (!found[kind]) {
      found[kind] = set;
      decided[kind] = name;
    } else if (*found[kind] != set) {
      return InvalidArgumentError(where(name) + ": in " + label(kind, set) + ", but " + where(decided[kind]) +
                                  " is in " + label(kind, *found[kind]) +
                                  ": a file holds one name set (docs/megatron_format.md)");
    }
  }
  const NameSet norms = found[0].value_or(found[1].value_or(NameSet::kTe));
  const NameSet experts = found[1].value_or(norms);
  if (norms == experts) return norms;
  if (norms == NameSet::kTe) return NameSet::kTeSequential;  // TE's spec without grouped GEMM
  return InvalidArgumentError(where(decided[1]) + ": in " + label(1, experts) + ", but " + where(decided[0]) +
                              " is in " + label(0, norms) +
                              ": no spec of megatron-core names so (docs/megatron_format.md, Mixture of experts)");
}

}  // namespace ptc::megatron
