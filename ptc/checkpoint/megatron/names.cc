#include "ptc/checkpoint/megatron/names.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

namespace ptc::megatron {
namespace {

// A fused norm of te names: its suffix there, its suffix in local names, and
// the submodule of its layer it is registered before in local names.
struct FusedNorm {
  std::string_view te, local, before;
};
constexpr FusedNorm kFused[] = {
    {".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight", ".self_attention."},
    {".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias", ".self_attention."},
    {".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight", ".mlp."},
    {".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias", ".mlp."},
};

// The fused norm `name` (te names) is, and its layer's prefix P; nullopt for another tensor.
std::optional<std::pair<const FusedNorm*, std::string_view>> Fused(std::string_view name) {
  for (const FusedNorm& f : kFused) {
    if (name.size() > f.te.size() && name.ends_with(f.te))
      return std::pair{&f, name.substr(0, name.size() - f.te.size())};
  }
  return std::nullopt;
}

}  // namespace

Result<NameSet> ParseNameSet(std::string_view text) {
  if (text == "te") return NameSet::kTe;
  if (text == "local") return NameSet::kLocal;
  return InvalidArgumentError("names '" + std::string(text) +
                              "': te (Megatron-Core with Transformer Engine) or local (its local layer spec)");
}

std::string_view NameSetName(NameSet names) { return names == NameSet::kTe ? "te" : "local"; }

std::string NameIn(NameSet names, std::string_view name) {
  const auto fused = Fused(name);
  if (names == NameSet::kTe || !fused) return std::string(name);
  return std::string(fused->second) + std::string(fused->first->local);
}

std::vector<size_t> RegistrationOrder(NameSet names, const std::vector<std::string>& te_order) {
  std::vector<size_t> order(te_order.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (names == NameSet::kTe) return order;
  // Each tensor's place: its own index; a fused norm's, just before the first
  // tensor of the submodule a local model registers it before (its own place
  // when the view has none), norms of one place in their te order.
  std::vector<std::tuple<size_t, int, size_t>> place(te_order.size());
  for (size_t i = 0; i < te_order.size(); ++i) {
    place[i] = {i, 1, i};
    const auto fused = Fused(te_order[i]);
    if (!fused) continue;
    const std::string head = std::string(fused->second) + std::string(fused->first->before);
    for (size_t j = 0; j < te_order.size(); ++j) {
      if (te_order[j].starts_with(head)) {
        place[i] = {j, 0, i};
        break;
      }
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return place[a] < place[b]; });
  return order;
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
  std::optional<NameSet> found;
  std::string decided;  // the file's name of the tensor that decided
  for (const LocalTensor& t : view.model) {
    if (!Fused(t.name)) continue;
    const std::string local = NameIn(NameSet::kLocal, t.name);
    const bool in_te = has(t.name), in_local = has(local);
    if (in_te && in_local) {
      return InvalidArgumentError(where(t.name) + ": also held as " + where(local) +
                                  " (Transformer Engine's and the local spec's names of one tensor)");
    }
    if (!in_te && !in_local) continue;  // missing: named when the tensors are looked up
    const NameSet set = in_te ? NameSet::kTe : NameSet::kLocal;
    const std::string name = in_te ? t.name : local;
    if (!found) {
      found = set;
      decided = name;
    } else if (*found != set) {
      auto label = [](NameSet s) {
        return s == NameSet::kTe ? std::string("Transformer Engine's names (te)")
                                 : std::string("the local spec's names (local)");
      };
      return InvalidArgumentError(where(name) + ": in " + label(set) + ", but " + where(decided) + " is in " +
                                  label(*found) + ": a file holds one name set (docs/megatron_format.md)");
    }
  }
  return found.value_or(NameSet::kTe);
}

}  // namespace ptc::megatron
