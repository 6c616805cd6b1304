#include "ptc/checkpoint/megatron/optimizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <set>

#include "ptc/format/torch_file.h"

namespace ptc::megatron {
namespace {

using pickle::Value;

// A number of a group's settings (int or float), or nullopt.
std::optional<double> Number(const Value& group, std::string_view key) {
  const Value* v = group.Find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind() == pickle::Kind::kFloat) return v->as_float();
  if (v->kind() == pickle::Kind::kInt) return static_cast<double>(v->as_int());
  return std::nullopt;
}

// The file's group without weight decay among two: wd_mult 0, else
// weight_decay 0 in one group only, else the second (Megatron's order).
size_t NoDecayGroup(const pickle::Items& groups) {
  for (const char* key : {"wd_mult", "weight_decay"}) {
    std::vector<size_t> zero;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (Number(groups[g], key) == 0.0) zero.push_back(g);
    }
    if (zero.size() == 1) return zero[0];
  }
  return 1;
}

// Megatron's groups of the parameters `members` (indices into view.model):
// indices into view.model.
std::array<std::vector<size_t>, 2> MegatronGroups(const RankView& view, const std::vector<size_t>& members) {
  std::array<std::vector<size_t>, 2> groups;
  for (size_t i : members) groups[WithoutWeightDecay(view.model[i]) ? 1 : 0].push_back(i);
  return groups;
}

// The rank's parameters (its model tensors but the buffers, which the
// optimizer never sees): indices into view.model, in its order.
std::vector<size_t> Parameters(const RankView& view) {
  std::vector<size_t> out;
  for (size_t i = 0; i < view.model.size(); ++i) {
    if (HasOptimizerState(view.model[i])) out.push_back(i);
  }
  return out;
}

// The rank's parameters of the dense optimizer (`experts` false) or of the
// expert-parallel one: indices into view.model, in its order.
std::vector<size_t> Members(const RankView& view, bool experts) {
  std::vector<size_t> out = Parameters(view);
  std::erase_if(out, [&](size_t i) { return IsExpertParameter(view.model[i]) != experts; });
  return out;
}

// " (its buffers, X ..., have none)" for a view with buffers; empty without.
std::string BuffersNote(const RankView& view) {
  std::vector<std::string> buffers;
  for (const LocalTensor& t : view.model) {
    if (!HasOptimizerState(t)) buffers.push_back(t.name);
  }
  if (buffers.empty()) return "";
  return " (its " + std::to_string(buffers.size()) + " buffer" + (buffers.size() == 1 ? ", " : "s, ") + buffers[0] +
         (buffers.size() == 1 ? ", has" : " ..., have") + " no optimizer state: schema \"buffer\")";
}

// The param groups of one optimizer `optimizer` (a Float16Optimizer's state
// dict) over the rank's parameters `all` (indices into view.model), into
// layout->slots with `chain`; `where` names it.
Status ReadGroups(const RankView& view, const std::vector<size_t>& all, const Value& optimizer, int chain,
                  const std::string& where, OptimizerLayout* layout) {
  const Value* inner = optimizer.Find("optimizer");
  const Value* groups = inner == nullptr ? nullptr : inner->Find("param_groups");
  if (groups == nullptr || !groups->is_sequence()) return InvalidArgumentError(where + ": missing or not a list");
  const pickle::Items& g = groups->items();
  // members[file group]: the rank's parameters it holds, in order.
  std::vector<std::vector<size_t>> members;
  const auto groups_of = MegatronGroups(view, all);
  std::vector<size_t> file_groups;
  if (g.size() == 1) {
    members.push_back(all);
    file_groups = {0};
  } else if (g.size() == 2) {
    const size_t no_decay = NoDecayGroup(g);
    members.resize(2);
    members[1 - no_decay] = groups_of[0];
    members[no_decay] = groups_of[1];
    file_groups = {1 - no_decay, no_decay};
  } else {
    return InvalidArgumentError(where + ": " + std::to_string(g.size()) +
                                " groups (Megatron's two, weight decay and none, or one)");
  }
  if (chain <= 0) layout->file_groups = file_groups;  // the dense optimizer's settings are kept
  if (chain == 1) {                                   // the expert-parallel one's: Megatron's group of each file group
    layout->expert_groups = g.size() == 2 ? std::vector<size_t>{1 - NoDecayGroup(g), NoDecayGroup(g)}
                                          : std::vector<size_t>{groups_of[0].empty() ? size_t{1} : size_t{0}};
  }
  for (size_t f = 0; f < g.size(); ++f) {
    const std::string label = where + "/" + std::to_string(f) + "/params";
    const Value* params = g[f].Find("params");
    if (params == nullptr || !params->is_sequence()) return InvalidArgumentError(label + ": missing or not a list");
    if (params->items().size() != members[f].size()) {
      std::string why = g.size() == 1 ? std::to_string(all.size()) + " parameters of the rank"
                                      : "the rank's " + std::to_string(all.size()) + " parameters make " +
                                            std::to_string(groups_of[0].size()) + " with weight decay and " +
                                            std::to_string(groups_of[1].size()) +
                                            " without (Megatron's rule: 1-D parameters and biases have none)";
      if (chain >= 0) why += chain == 0 ? " (the dense optimizer's)" : " (the expert-parallel optimizer's)";
      why += BuffersNote(view);
      return InvalidArgumentError(label + ": " + std::to_string(params->items().size()) + " parameters, " +
                                  std::to_string(members[f].size()) + " expected: " + why);
    }
    for (size_t j = 0; j < members[f].size(); ++j) {
      const Value& key = params->items()[j];
      if (key.kind() != pickle::Kind::kInt) {
        return InvalidArgumentError(label + "/" + std::to_string(j) + ": a " +
                                    std::string(pickle::KindName(key.kind())) + ", not an int");
      }
      layout->slots[members[f][j]] = {f, j, key, chain};
    }
  }
  return Status::OK();
}

// torch.optim.Adam's defaults, with Megatron's multipliers (group 1: no weight decay).
Value DefaultSettings(size_t group) {
  Value d = Value::Dict();
  d.Set("lr", Value::Float(1e-3));
  d.Set("betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));
  d.Set("eps", Value::Float(1e-8));
  d.Set("weight_decay", Value::Float(0.0));
  d.Set("amsgrad", Value::Bool(false));
  d.Set("wd_mult", Value::Float(group == 0 ? 1.0 : 0.0));
  d.Set("lr_mult", Value::Float(1.0));
  // Megatron-Core matches a loaded group to its own by these and the two
  // multipliers (MegatronOptimizer._filter_and_reorder_param_groups).
  d.Set("is_expert_parallel", Value::Bool(false));
  d.Set("is_decoupled_lr", Value::Bool(false));
  return d;
}

// Group g's settings as rendered: the kept ones of two groups; else the
// defaults, with the kept ones of a single group over them (but for the
// weight decay of group 1, which has none).
Value Settings(const OptimizerMeta& meta, size_t g) {
  const pickle::Items& kept = meta.groups.items();
  if (kept.size() == 2 && kept[g].is_dict()) return kept[g];
  Value out = DefaultSettings(g);
  if (kept.size() == 1 && kept[0].is_dict()) {
    for (const auto& [k, v] : kept[0].pairs()) {
      const bool decay = k.kind() == pickle::Kind::kStr && (k.as_str() == "weight_decay" || k.as_str() == "wd_mult");
      if (g == 0 || !decay) out.Set(k, v);
    }
  }
  return out;
}

// A 0-dim float32 tensor of storage `key`.
Value ScalarTensor(const std::string& key) {
  pickle::Tensor t;
  t.storage_key = key;
  t.dtype = DType::kF32;
  t.storage_numel = 1;
  return Value::FromTensor(std::move(t));
}

// The bytes of a float32 `iteration`: a step of torch Adam.
std::string IterationStep(uint64_t iteration) {
  const float f = static_cast<float>(iteration);
  std::string b(sizeof(f), '\0');
  std::memcpy(b.data(), &f, sizeof(f));
  return b;
}

}  // namespace

bool WithoutWeightDecay(const LocalTensor& param) {
  return param.shape.size() == 1 || std::string_view(param.name).ends_with(".bias");
}

Result<OptimizerLayout> ReadOptimizerLayout(const RankView& view, const Value& optimizer, const std::string& what) {
  OptimizerLayout layout;
  layout.slots.resize(view.model.size());
  if (!optimizer.is_sequence()) {
    PTC_RETURN_IF_ERROR(
        ReadGroups(view, Parameters(view), optimizer, -1, what + ": optimizer/optimizer/param_groups", &layout));
    return layout;
  }
  // Megatron-Core's ChainedOptimizer: the dense optimizer, then the expert-parallel one.
  const pickle::Items& chain = optimizer.items();
  if (chain.size() != 2) {
    return InvalidArgumentError(what + ": optimizer: a list of " + std::to_string(chain.size()) +
                                " optimizers; Megatron-Core chains two, the dense and the expert-parallel one "
                                "(expert parameters with ep > 1)");
  }
  for (int c = 0; c < 2; ++c) {
    PTC_RETURN_IF_ERROR(ReadGroups(view, Members(view, c == 1), chain[c], c,
                                   what + ": optimizer/" + std::to_string(c) + "/optimizer/param_groups", &layout));
  }
  layout.chained = true;
  return layout;
}

std::vector<Value> OptimizerPath(const OptimizerLayout& layout, std::string_view kind, size_t i) {
  const OptimizerLayout::Slot& s = layout.slots[i];
  std::vector<Value> path = {Value::Str("optimizer")};
  if (s.chain >= 0) path.push_back(Value::Int(s.chain));
  if (kind == "fp32") {
    path.insert(path.end(), {Value::Str("fp32_from_fp16_params"), Value::Int(static_cast<int64_t>(s.group)),
                             Value::Int(static_cast<int64_t>(s.position))});
  } else {
    path.insert(path.end(), {Value::Str("optimizer"), Value::Str("state"), s.key, Value::Str(std::string(kind))});
  }
  return path;
}

Value GroupSettings(const OptimizerLayout& layout, const Value& optimizer) {
  const Value& dense = layout.chained ? optimizer.items()[0] : optimizer;
  const pickle::Items& groups = dense.Find("optimizer")->Find("param_groups")->items();
  Value out = Value::List();
  for (size_t f : layout.file_groups) {
    Value settings = groups[f].is_dict() ? groups[f] : Value::Dict();
    while (settings.is_dict() && settings.Erase("params")) {}
    out.items().push_back(std::move(settings));
  }
  return out;
}

Value ExpertGroupSettings(const OptimizerLayout& layout, const Value& optimizer) {
  if (!layout.chained) return Value::List();
  const pickle::Items& groups = optimizer.items()[1].Find("optimizer")->Find("param_groups")->items();
  Value out = Value::List({Value::None(), Value::None()});
  for (size_t f = 0; f < layout.expert_groups.size() && f < groups.size(); ++f) {
    const Value* params = groups[f].Find("params");
    if (!groups[f].is_dict() || params == nullptr || params->items().empty()) continue;
    Value settings = groups[f];
    while (settings.Erase("params")) {}
    out.items()[layout.expert_groups[f]] = std::move(settings);
  }
  return out;
}

namespace {

// The expert-parallel optimizer's group g: kept, else the dense group's, is_expert_parallel.
Value ExpertSettings(const OptimizerMeta& meta, size_t g) {
  const pickle::Items& kept = meta.expert_groups.items();
  if (kept.size() == 2 && kept[g].is_dict()) return kept[g];
  Value out = Settings(meta, g);
  out.Set("is_expert_parallel", Value::Bool(true));
  return out;
}

// What RenderOptimizer renders one optimizer with.
struct RenderContext {
  const RankView& view;
  const OptimizerMeta& meta;
  uint64_t iteration;
  const std::function<Value(const LocalTensor&)>& add;
  RankState* out;
  std::vector<std::map<std::string, const LocalTensor*>> kinds;  // parameter i's optimizer tensors by kind
  std::map<std::string, const StepValue*> step_of;
  const CarriedTensor* default_step = nullptr;
};

// The step of parameter i, state `key`, its storage "<prefix><key>".
Value RenderStep(RenderContext& c, size_t i, int64_t key, const std::string& prefix) {
  const std::string storage = prefix + std::to_string(key);
  const LocalTensor& param = c.view.model[i];
  const auto it = param.segments.empty() ? c.step_of.end() : c.step_of.find(param.segments[0].tensor);
  const CarriedTensor* bytes = nullptr;
  Value v;
  if (it != c.step_of.end()) {
    v = it->second->value;
    if (!v.is_tensor()) return v;
    bytes = &it->second->tensors.at(0);
  } else {
    if (c.default_step == nullptr) {
      c.out->own.push_back({"s", DType::kF32, 1, IterationStep(c.iteration)});
      c.default_step = &c.out->own.back();
    }
    v = ScalarTensor(storage);
    bytes = c.default_step;
  }
  // Each state its own storage: Adam adds to its step in place.
  v.tensor().storage_key = storage;
  c.out->storages.push_back({storage, nullptr, bytes});
  return v;
}

// One Float16OptimizerWithFloat16Params state dict over the parameters
// `members` (indices into view.model): the dense optimizer's two groups, or
// the expert-parallel one's (`experts`: is_expert_parallel, only its groups
// that hold parameters, as Megatron-Core makes none for a key no rank has).
Value RenderOne(RenderContext& c, const std::vector<size_t>& members, bool experts) {
  Value state = Value::Dict(), param_groups = Value::List(), masters = Value::List();
  int64_t key = 0;
  const auto groups = MegatronGroups(c.view, members);
  for (size_t g = 0; g < groups.size(); ++g) {
    // The experts' groups that hold parameters (the one with weight decay when none does: a stage without MoE layers).
    if (experts && groups[g].empty() && (g == 1 || !groups[1].empty())) continue;
    Value params = Value::List(), fp32 = Value::List();
    for (size_t i : groups[g]) {
      Value s = Value::Dict();
      s.Set("step", RenderStep(c, i, key, experts ? "se" : "s"));
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        if (const auto k = c.kinds[i].find(kind); k != c.kinds[i].end()) s.Set(kind, c.add(*k->second));
      }
      if (const auto k = c.kinds[i].find("fp32"); k != c.kinds[i].end()) fp32.items().push_back(c.add(*k->second));
      state.pairs().emplace_back(Value::Int(key), std::move(s));  // a fresh key: no Set's scan
      params.items().push_back(Value::Int(key++));
    }
    Value group = experts ? ExpertSettings(c.meta, g) : Settings(c.meta, g);
    group.Set("params", std::move(params));
    param_groups.items().push_back(std::move(group));
    masters.items().push_back(std::move(fp32));
  }
  Value inner = Value::Dict();
  inner.Set("state", std::move(state));
  inner.Set("param_groups", std::move(param_groups));
  // Megatron's order: optimizer, grad_scaler (kept), fp32_from_fp16_params.
  Value optimizer = Value::Dict();
  optimizer.Set("optimizer", std::move(inner));
  if (const Value* kept = c.out->root.Find("optimizer"); kept != nullptr && kept->is_dict()) {
    for (const auto& [k, v] : kept->pairs()) optimizer.Set(k, v);
  }
  optimizer.Set("fp32_from_fp16_params", std::move(masters));
  return optimizer;
}

}  // namespace

void RenderOptimizer(const RankView& view, const OptimizerMeta& meta, uint64_t iteration, bool expert_parallel,
                     const std::function<Value(const LocalTensor&)>& add, RankState* out) {
  RenderContext c{view, meta, iteration, add, out, {}, {}, nullptr};
  std::map<std::string, size_t> param_index;
  for (size_t i = 0; i < view.model.size(); ++i) param_index[view.model[i].name] = i;
  c.kinds.resize(view.model.size());
  for (const LocalTensor& t : view.optim) {
    const size_t dot = t.name.rfind('.');
    c.kinds[param_index.at(t.name.substr(0, dot))][t.name.substr(dot + 1)] = &t;
  }
  for (const StepValue& s : meta.steps) {
    for (const std::string& p : s.params) c.step_of[p] = &s;
  }
  if (!expert_parallel) {
    out->root.Set("optimizer", RenderOne(c, Parameters(view), false));
    return;
  }
  // Megatron-Core's ChainedOptimizer over the dense and the expert-parallel optimizer.
  Value dense = RenderOne(c, Members(view, false), false);
  Value experts = RenderOne(c, Members(view, true), true);
  out->root.Set("optimizer", Value::List({std::move(dense), std::move(experts)}));
}

Value RenderedSettings(const OptimizerMeta& meta, size_t g) { return Settings(meta, g); }
Value RenderedExpertSettings(const OptimizerMeta& meta, size_t g) { return ExpertSettings(meta, g); }

StepValue RenderedStep(const OptimizerMeta& meta, const std::string& param, uint64_t iteration) {
  for (const StepValue& s : meta.steps) {
    if (std::find(s.params.begin(), s.params.end(), param) != s.params.end()) return s;
  }
  return StepValue{{param}, ScalarTensor("s"), {{"s", DType::kF32, 1, IterationStep(iteration)}}};
}

Result<Value> McoreOptimizerCommon(const MegatronState& state, bool masters, std::vector<CarriedTensor>* storages,
                                   const std::vector<size_t>& expert_groups) {
  const OptimizerMeta& meta = state.optimizer;
  if (meta.steps.size() > 1) {
    return FailedPreconditionError("the Adam step of " + meta.steps[0].params.at(0) + " differs from that of " +
                                   meta.steps[1].params.at(0) +
                                   ": Megatron-Core's torch_dist keeps one step for every parameter");
  }
  Value step;
  if (meta.steps.empty()) {
    storages->push_back({"s", DType::kF32, 1, IterationStep(state.iteration)});
    step = ScalarTensor("s");
  } else {
    step = meta.steps[0].value;
    if (step.is_tensor()) storages->push_back(meta.steps[0].tensors.at(0));  // key "s"
  }
  const Value* kept = state.carried.is_dict() ? state.carried.Find("optimizer") : nullptr;
  if (masters && kept != nullptr && kept->is_dict()) {
    std::set<std::string> used;
    for (const auto& [k, v] : kept->pairs()) {
      pickle::ForEachTensor(v, [&](const std::string&, const pickle::Tensor& t) { used.insert(t.storage_key); });
    }
    for (const CarriedTensor& c : state.tensors) {
      if (used.count(c.key) != 0) storages->push_back(c);
    }
  }
  // One optimizer's part over Megatron's groups `groups` (is_expert_parallel with `experts`).
  auto part = [&](const std::vector<size_t>& groups, bool experts) {
    Value settings = Value::List();
    for (size_t g : groups) settings.items().push_back(experts ? ExpertSettings(meta, g) : Settings(meta, g));
    Value inner = Value::Dict();
    inner.Set("param_groups", std::move(settings));
    inner.Set("state", Value::Dict({{Value::Str("common_step"), step}}));
    if (!masters) return inner;
    Value out = Value::Dict();
    out.Set("optimizer", std::move(inner));
    if (kept != nullptr && kept->is_dict()) {
      for (const auto& [k, v] : kept->pairs()) out.Set(k, v);
    }
    return out;
  };
  Value dense = part({0, 1}, false);
  if (expert_groups.empty()) return dense;
  return Value::Dict({{Value::Int(0), std::move(dense)}, {Value::Int(1), part(expert_groups, true)}});
}

namespace {

// The step a common part's (Float16 or FP32 layout) 'state' holds; nullptr when none.
const Value* CommonStep(const Value& optimizer) {
  const Value* nested = optimizer.Find("optimizer");
  const Value& inner = nested != nullptr && nested->is_dict() ? *nested : optimizer;
  const Value* state = inner.Find("state");
  return state == nullptr ? nullptr : state->Find("common_step");
}

// A ChainedOptimizer's part {0: dense, 1: expert-parallel} (int keys): its dense part.
// \error InvalidArgument naming the entry: keys other than 0 and 1, or two steps that differ.
Result<const Value*> DensePart(const Value& optimizer,
                               const std::function<Result<std::string>(const pickle::Tensor&)>& read,
                               const std::string& what) {
  const Value* dense = optimizer.Find(Value::Int(0));
  const Value* experts = optimizer.Find(Value::Int(1));
  if (dense == nullptr || experts == nullptr || optimizer.pairs().size() != 2 || !dense->is_dict() ||
      !experts->is_dict()) {
    return InvalidArgumentError(what +
                                ": optimizer: a dict by optimizer index whose keys are not 0 and 1 "
                                "(Megatron-Core's ChainedOptimizer of the dense and the expert-parallel one)");
  }
  const Value* a = CommonStep(*dense);
  const Value* b = CommonStep(*experts);
  bool same = (a == nullptr) == (b == nullptr);
  if (same && a != nullptr && a->is_tensor() && b->is_tensor()) {
    PTC_ASSIGN_OR_RETURN(const std::string x, read(a->tensor()));
    PTC_ASSIGN_OR_RETURN(const std::string y, read(b->tensor()));
    same = x == y && a->tensor().dtype == b->tensor().dtype;
  } else if (same && a != nullptr) {
    same = !a->is_tensor() && !b->is_tensor() && a->DebugString() == b->DebugString();
  }
  if (!same) {
    return InvalidArgumentError(what +
                                ": optimizer/1: its common_step differs from optimizer/0's (Megatron-Core's "
                                "ChainedOptimizer keeps one step)");
  }
  return dense;
}

// The settings of a ChainedOptimizer's expert-parallel part's groups, by Megatron's group
// (OptimizerMeta::expert_groups): two groups by their weight decay (NoDecayGroup), one by its
// wd_mult (0: the group without).
// \error InvalidArgument naming the entry: no list of one or two dict groups.
Result<Value> ExpertPartGroups(const Value& experts, const std::string& what) {
  const Value* nested = experts.Find("optimizer");
  const Value& inner = nested != nullptr && nested->is_dict() ? *nested : experts;
  const Value* groups = inner.Find("param_groups");
  const std::string where = what + ": optimizer/1" + (nested != nullptr ? "/optimizer" : "") + "/param_groups";
  if (groups == nullptr || !groups->is_sequence() || groups->items().empty() || groups->items().size() > 2 ||
      !std::all_of(groups->items().begin(), groups->items().end(), [](const Value& g) { return g.is_dict(); })) {
    return InvalidArgumentError(where + ": a list of one or two dict groups expected");
  }
  const pickle::Items& g = groups->items();
  Value out = Value::List({Value::None(), Value::None()});
  for (size_t f = 0; f < g.size(); ++f) {
    const size_t megatron = g.size() == 2 ? (f == NoDecayGroup(g) ? 1 : 0) : (Number(g[f], "wd_mult") == 0.0 ? 1 : 0);
    Value settings = g[f];
    while (settings.Erase("params")) {}
    out.items()[megatron] = std::move(settings);
  }
  return out;
}

}  // namespace

Result<McoreOptimizerCommonPart> ReadMcoreOptimizerCommon(
    const Value& chained, const std::vector<std::string>& params,
    const std::function<Result<std::string>(const pickle::Tensor&)>& read, const std::string& what) {
  if (!chained.is_dict()) return InvalidArgumentError(what + ": optimizer: not a dict");
  const bool by_index = !chained.pairs().empty() && chained.pairs().front().first.kind() == pickle::Kind::kInt;
  const Value* dense = &chained;
  if (by_index) {
    PTC_ASSIGN_OR_RETURN(dense, DensePart(chained, read, what));
  }
  const Value& optimizer = *dense;
  const Value* nested = optimizer.Find("optimizer");
  const bool float16 = nested != nullptr && nested->is_dict();
  const Value& inner = float16 ? *nested : optimizer;
  const std::string where = what + (float16 ? ": optimizer/optimizer" : ": optimizer");
  McoreOptimizerCommonPart out;
  if (by_index) {
    PTC_ASSIGN_OR_RETURN(out.meta.expert_groups, ExpertPartGroups(*chained.Find(Value::Int(1)), what));
  }
  const Value* groups = inner.Find("param_groups");
  if (groups == nullptr || !groups->is_sequence() || groups->items().empty() || groups->items().size() > 2) {
    return InvalidArgumentError(where + "/param_groups: a list of one or two groups expected");
  }
  pickle::Items settings = groups->items();
  for (Value& g : settings) {
    if (!g.is_dict()) return InvalidArgumentError(where + "/param_groups: a group is not a dict");
    while (g.Erase("params")) {}  // a pickled dict may repeat a key
  }
  if (settings.size() == 2 && NoDecayGroup(settings) == 0) std::swap(settings[0], settings[1]);
  out.meta.groups = Value::List(std::move(settings));
  const Value* state = inner.Find("state");
  const Value* step = state == nullptr ? nullptr : state->Find("common_step");
  if (step == nullptr) {
    // Megatron-Core leaves out a step that is 0 (`if step:`): torch Adam's float32 0.
    out.meta.steps.push_back({params, ScalarTensor("s"), {{"s", DType::kF32, 1, IterationStep(0)}}});
  } else {
    StepValue value{params, *step, {}};
    if (step->is_tensor()) {
      pickle::Tensor& t = value.value.tensor();
      if (TensorNumElements(t) != 1) return InvalidArgumentError(where + "/state/common_step: not one number");
      PTC_ASSIGN_OR_RETURN(std::string bytes, read(t));
      value.tensors.push_back({"s", t.dtype, 1, std::move(bytes)});
      PointAtOwnStorage("s", t);
    } else if (step->kind() != pickle::Kind::kInt && step->kind() != pickle::Kind::kFloat) {
      return InvalidArgumentError(where + "/state/common_step: a " + std::string(pickle::KindName(step->kind())) +
                                  ", not a tensor or a number");
    }
    out.meta.steps.push_back(std::move(value));
  }
  if (!float16) return out;
  out.kept = Value::Dict();
  for (const auto& [k, v] : optimizer.pairs()) {
    if (k.kind() == pickle::Kind::kStr && (k.as_str() == "optimizer" || k.as_str() == "fp32_from_fp16_params")) {
      continue;
    }
    const Value& name = k;  // a structured binding is not captured by the lambda below
    Value entry = v;
    Status error;
    pickle::ForEachTensor(entry, [&](const std::string& path, pickle::Tensor& t) {
      if (!error.ok()) return;
      if (TensorNumBytes(t) > kMaxCarriedTensorBytes) {
        error = InvalidArgumentError(what + ": optimizer/" + name.DebugString() + path + ": a tensor of " +
                                     std::to_string(TensorNumBytes(t)) + " bytes (at most " +
                                     std::to_string(kMaxCarriedTensorBytes) + " are kept)");
        return;
      }
      auto bytes = read(t);
      if (!bytes.ok()) {
        error = bytes.status();
        return;
      }
      const std::string key = "g" + std::to_string(out.tensors.size());
      out.tensors.push_back({key, t.dtype, TensorNumElements(t), std::move(bytes).value()});
      PointAtOwnStorage(key, t);
    });
    PTC_RETURN_IF_ERROR(error);
    out.kept.Set(k, std::move(entry));
  }
  if (out.kept.pairs().empty()) out.kept = Value::None();
  return out;
}

}  // namespace ptc::megatron
