// Adam's step and the param groups as DCP objects (dcp.h, OptimizerObjects).
#include "ptc/checkpoint/megatron/optimizer.h"

#include <array>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/checkpoint/dcp/dcp.h"

namespace ptc::dcp {

using pickle::Value;

std::vector<OptimizerParam> OptimizerParams(const std::vector<Tensor>& tensors, Keys keys) {
  const std::string prefix = keys == Keys::kTorchtitan ? "optimizer.state." : "optim.state.";
  constexpr std::string_view kSuffix = ".exp_avg";
  std::vector<OptimizerParam> out;
  std::map<std::string, size_t> stacked;  // name -> index in out
  for (const Tensor& t : tensors) {
    if (t.key.rfind(prefix, 0) != 0 || !std::string_view(t.key).ends_with(kSuffix) ||
        !std::string_view(t.name).ends_with(kSuffix)) {
      continue;
    }
    const std::string global = t.name.substr(0, t.name.size() - kSuffix.size());
    std::string name = t.key.substr(prefix.size(), t.key.size() - prefix.size() - kSuffix.size());
    if (t.layer >= 0) {  // a stacked key's slices: one parameter
      auto [it, inserted] = stacked.try_emplace(name, out.size());
      if (!inserted) {
        out[it->second].stacked.push_back(global);
        continue;
      }
    }
    out.push_back(
        {std::move(name), global, megatron::WithoutWeightDecay(LocalTensor{global, t.dtype, t.shape, {}}) ? 1 : 0});
  }
  return out;
}

Result<std::vector<Object>> OptimizerObjects(const std::vector<Tensor>& tensors, Keys keys,
                                             const megatron::OptimizerMeta& meta, uint64_t iteration) {
  const bool titan = keys == Keys::kTorchtitan;
  const std::vector<OptimizerParam> params = OptimizerParams(tensors, keys);
  std::vector<Object> out;
  auto add = [&](std::string key, pickle::Items path, const Value& value,
                 const std::vector<megatron::CarriedTensor>& storages = {}) -> Status {
    PTC_ASSIGN_OR_RETURN(std::string bytes, TorchSaveBytes(value, storages), key);
    Object o{std::move(key), std::move(bytes)};
    if (value.is_tensor()) {
      o.scalar = true;
      o.dtype = value.tensor().dtype;
    }
    o.path = std::move(path);
    out.push_back(std::move(o));
    return Status::OK();
  };
  // Steps.
  for (const OptimizerParam& p : params) {
    const megatron::StepValue step = megatron::RenderedStep(meta, p.global, iteration);
    const std::string key = (titan ? "optimizer.state." : "optim.state.") + p.name + ".step";
    pickle::Items path =
        titan ? pickle::Items{Value::Str("optimizer"), Value::Str("state." + p.name + ".step")}
              : pickle::Items{Value::Str("optim"), Value::Str("state"), Value::Str(p.name), Value::Str("step")};
    PTC_RETURN_IF_ERROR(add(key, std::move(path), step.value, step.tensors));
  }
  // Groups: one kept group of every parameter, else Megatron's two (1-D
  // parameters and biases without weight decay).
  const bool one = meta.groups.items().size() == 1;
  std::array<Value, 2> settings = {megatron::RenderedSettings(meta, 0), megatron::RenderedSettings(meta, 1)};
  auto group_of = [one](const OptimizerParam& p) { return one ? 0 : p.group; };
  if (titan) {
    for (const OptimizerParam& p : params) {
      for (const auto& [k, v] : settings[static_cast<size_t>(group_of(p))].pairs()) {
        if (k.kind() != pickle::Kind::kStr) continue;
        const std::string flat = "param_groups." + p.name + "." + k.as_str();
        PTC_RETURN_IF_ERROR(add("optimizer." + flat, {Value::Str("optimizer"), Value::Str(flat)}, v));
      }
    }
    return out;
  }
  for (int g = 0; g < (one ? 1 : 2); ++g) {
    Value names = Value::List();
    for (const OptimizerParam& p : params) {
      if (group_of(p) == g) names.items().push_back(Value::Str(p.name));
    }
    Value group = settings[static_cast<size_t>(g)];
    group.Set("params", std::move(names));
    for (const auto& [k, v] : group.pairs()) {
      if (k.kind() != pickle::Kind::kStr) continue;
      const std::string key = "optim.param_groups." + std::to_string(g) + "." + k.as_str();
      PTC_RETURN_IF_ERROR(
          add(key, {Value::Str("optim"), Value::Str("param_groups"), Value::Int(g), Value::Str(k.as_str())}, v));
    }
  }
  return out;
}

}  // namespace ptc::dcp
