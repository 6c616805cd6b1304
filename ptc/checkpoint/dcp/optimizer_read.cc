// Adam's steps and the param groups of a DCP save (dcp/read.h, SavedOptimizer).
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/base/file_range.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"

namespace ptc::dcp {
namespace {

using pickle::Value;

Status Bad(const std::string& where, const std::string& what) { return InvalidArgumentError(where + ": " + what); }

bool StartsWith(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// Two values alike: pickled alike (a NaN is like itself).
bool Alike(const Value& a, const Value& b) { return pickle::Pickle(a) == pickle::Pickle(b); }

// Two groups' settings alike, in any order of their keys.
bool SameSettings(const Value& a, const Value& b) {
  if (a.pairs().size() != b.pairs().size()) return false;
  for (const auto& [k, v] : a.pairs()) {
    const Value* other = b.Find(k);
    if (other == nullptr || !Alike(*other, v)) return false;
  }
  return true;
}

// Two steps alike: their values, and a tensor's bytes.
bool Same(const megatron::StepValue& a, const megatron::StepValue& b) {
  if (!Alike(a.value, b.value) || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].bytes != b.tensors[i].bytes) return false;
  }
  return true;
}

}  // namespace

bool OptimizerEntryKey(const std::string& key) {
  const bool step = (StartsWith(key, "optim.state.") || StartsWith(key, "optimizer.state.")) && key.size() > 5 &&
                    key.compare(key.size() - 5, 5, ".step") == 0;
  return step || StartsWith(key, "optim.param_groups.") || StartsWith(key, "optimizer.param_groups.");
}

Result<std::optional<megatron::OptimizerMeta>> PartsOptimizer(const OptimizerPart& part,
                                                              const std::vector<EntryBytes>& entries,
                                                              const std::string& what) {
  PTC_ASSIGN_OR_RETURN(const EntriesFiles files, EntriesFiles::Make(entries, what));
  auto open = [&](const std::string& name) { return files.Open(name); };
  return SavedOptimizer(*part.saved, part.model, part.keys, open, what);
}

namespace {

// The optimizer entries of a save, as SavedOptimizer reads them.
class OptimizerEntries {
 public:
  using OpenFn = std::function<Result<const RandomAccessFile*>(const std::string& file)>;
  OptimizerEntries(const std::vector<Tensor>& model, Keys keys, const OpenFn& open, const std::string& what)
      : open_(open), what_(what) {
    for (OptimizerParam& p : OptimizerParams(model, keys)) params_.emplace(p.name, std::move(p));
  }
  const std::map<std::string, OptimizerParam>& params() const { return params_; }

  // "<prefix><name>.<rest>": the parameter, and rest (its last dotted part).
  std::optional<std::pair<const OptimizerParam*, std::string>> Split(const std::string& key,
                                                                     const std::string& prefix) const {
    const size_t dot = key.rfind('.');
    if (!StartsWith(key, prefix) || dot == std::string::npos || dot <= prefix.size()) return std::nullopt;
    auto it = params_.find(key.substr(prefix.size(), dot - prefix.size()));
    if (it == params_.end()) return std::nullopt;
    return std::make_pair(&it->second, key.substr(dot + 1));
  }

  // The entry of `key` at [offset, offset + length) of `file`: with `tensor`
  // a step (a one-element tensor or a number), else a group's setting (no tensors).
  // \error InvalidArgument naming the key and its bytes.
  Result<megatron::StepValue> Read(const std::string& key, const std::string& file, uint64_t offset, uint64_t length,
                                   bool tensor) const {
    const std::string where =
        what_ + ": key " + key + " (" + file + " bytes " + std::to_string(offset) + "+" + std::to_string(length) + ")";
    if (file.empty()) return Bad(where, "has no storage record");
    PTC_ASSIGN_OR_RETURN(const RandomAccessFile* f, open_(file), where);
    if (offset > f->Size() || length > f->Size() - offset) return Bad(where, "lies past the end of the file");
    if (length > kMaxTorchPickleSize) {
      return Bad(where, "is larger than " + std::to_string(kMaxTorchPickleSize) + " bytes");
    }
    const FileRange range(*f, offset, length, where);
    PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(range, where));
    megatron::StepValue out{{}, tf.root, {}};
    if (!tensor) {
      bool any = false;
      pickle::ForEachTensor(tf.root, [&](const std::string&, const pickle::Tensor&) { any = true; });
      if (any) return Bad(where, "holds a tensor; ptcfs keeps a group's settings as plain values");
      return out;
    }
    if (tf.root.is_tensor()) {
      pickle::Tensor t = tf.root.tensor();
      if (TensorNumElements(t) != 1) return Bad(where, "holds a tensor of " + ShapeToString(t.shape) + ", not a step");
      PTC_ASSIGN_OR_RETURN(std::string bytes, ReadTensorBytes(range, tf, t, where));
      megatron::PointAtOwnStorage("s", t);
      out.tensors.push_back({"s", t.dtype, 1, std::move(bytes)});
      out.value = Value::FromTensor(std::move(t));
    } else if (tf.root.kind() != pickle::Kind::kInt && tf.root.kind() != pickle::Kind::kFloat) {
      return Bad(where, "holds a " + std::string(KindName(tf.root.kind())) + ", not a step");
    }
    return out;
  }

 private:
  std::map<std::string, OptimizerParam> params_;  // by name in the keys
  const OpenFn& open_;
  const std::string& what_;
};

// The steps: one per global tensor (the keys of one must agree), parameters
// of equal steps together.
Result<std::vector<megatron::StepValue>> ReadSteps(const SavedCheckpoint& saved, const OptimizerEntries& entries,
                                                   const std::string& state_prefix, const std::string& what) {
  std::map<std::string, std::pair<std::string, megatron::StepValue>> steps;  // global -> (key, step)
  for (const SavedTensor& t : saved.tensors) {
    auto p = entries.Split(t.key, state_prefix);
    if (!p || p->second != "step") continue;
    if (t.chunks.size() != 1) return Bad(what, "key " + t.key + ": a step is one chunk");
    const SavedChunk& c = t.chunks.front();
    PTC_ASSIGN_OR_RETURN(megatron::StepValue step, entries.Read(t.key, c.file, c.offset, c.length, /*tensor=*/true));
    std::vector<std::string> globals = p->first->stacked;  // a stacked key: the step of each slice's
    globals.push_back(p->first->global);
    for (const std::string& global : globals) {
      auto [it, inserted] = steps.try_emplace(global, t.key, step);
      if (!inserted && !Same(it->second.second, step)) {
        return Bad(what, "key " + t.key + ": its step differs from that of " + it->second.first + " (both " + global +
                             "'s, which keeps one)");
      }
    }
  }
  std::vector<megatron::StepValue> out;
  for (auto& [global, entry] : steps) {
    megatron::StepValue& step = entry.second;
    auto same = std::find_if(out.begin(), out.end(), [&](const megatron::StepValue& s) { return Same(s, step); });
    if (same != out.end()) {
      same->params.push_back(global);
    } else {
      step.params = {global};
      out.push_back(std::move(step));
    }
  }
  return out;
}

// The groups' settings as saved (torch: by index, its 'params' the members;
// torchtitan: per parameter).
struct SavedGroups {
  std::map<std::string, Value> settings;                    // torch: "G"; torchtitan: the parameter's name -> dict
  std::map<std::string, std::vector<std::string>> members;  // torch: "G" -> its params' names
};

Result<SavedGroups> ReadGroups(const SavedCheckpoint& saved, const OptimizerEntries& entries, bool titan,
                               const std::string& groups_prefix, const std::string& what) {
  SavedGroups out;
  for (const SavedBytes& b : saved.bytes) {
    if (!StartsWith(b.key, groups_prefix)) continue;
    std::string owner, setting;
    if (titan) {
      auto p = entries.Split(b.key, groups_prefix);
      if (!p) return Bad(what, "key " + b.key + " names no parameter of the model");
      owner = p->first->name;
      setting = p->second;
    } else {
      const size_t dot = b.key.find('.', groups_prefix.size());
      if (dot == std::string::npos) return Bad(what, "key " + b.key + ": not optim.param_groups.G.K");
      owner = b.key.substr(groups_prefix.size(), dot - groups_prefix.size());
      setting = b.key.substr(dot + 1);
      if (owner.empty() || owner.size() > 6 || owner.find_first_not_of("0123456789") != std::string::npos) {
        return Bad(what, "key " + b.key + ": not optim.param_groups.G.K");
      }
    }
    PTC_ASSIGN_OR_RETURN(megatron::StepValue r, entries.Read(b.key, b.file, b.offset, b.length, /*tensor=*/false));
    if (setting == "params") {
      if (titan || !r.value.is_sequence()) return Bad(what, "key " + b.key + ": not a list of parameter names");
      for (const Value& v : r.value.items()) {
        if (v.kind() != pickle::Kind::kStr || entries.params().count(v.as_str()) == 0) {
          return Bad(what, "key " + b.key + ": an entry is no parameter name of the model");
        }
        out.members[owner].push_back(v.as_str());
      }
      continue;
    }
    auto [it, inserted] = out.settings.try_emplace(owner, Value::Dict());
    it->second.Set(Value::Str(setting), std::move(r.value));
  }
  return out;
}

// One group of every parameter, or Megatron's two (0: weight decay for 2-D
// parameters, 1: none for 1-D ones and biases): the settings of each.
// \error InvalidArgument naming two parameters (or groups) of one Megatron group whose settings differ.
Result<Value> MegatronGroups(const SavedGroups& saved, const OptimizerEntries& entries, bool titan,
                             const std::string& what) {
  std::array<std::optional<std::pair<std::string, Value>>, 2> groups;  // (who, settings)
  bool one = true;                                                     // every parameter has the same settings
  auto take = [&](int g, const std::string& who, const Value& s) -> Status {
    auto& slot = groups[static_cast<size_t>(g)];
    if (!slot) {
      slot = std::make_pair(who, s);
    } else if (!SameSettings(slot->second, s)) {
      return Bad(what, who + " and " + slot->first +
                           " have different optimizer settings; ptcfs keeps one param group of every parameter "
                           "or Megatron's two (weight decay for 2-D parameters, none for 1-D ones and biases)");
    }
    if (groups[static_cast<size_t>(1 - g)] && !SameSettings(groups[static_cast<size_t>(1 - g)]->second, s)) one = false;
    return Status::OK();
  };
  const auto& params = entries.params();
  if (titan) {
    for (const auto& [name, s] : saved.settings) {
      PTC_RETURN_IF_ERROR(take(params.at(name).group, "parameter " + name, s));
    }
  } else {
    for (const auto& [g, s] : saved.settings) {
      auto m = saved.members.find(g);
      if (m == saved.members.end()) return Bad(what, "param group " + g + " lists no params");
      for (const std::string& name : m->second) PTC_RETURN_IF_ERROR(take(params.at(name).group, "param group " + g, s));
    }
    // Two groups that are Megatron's split stay two even when their settings agree.
    if (saved.settings.size() == 2) one = false;
  }
  Value out = Value::List();
  for (size_t g = 0; g < (one ? 1 : 2); ++g) {
    const auto& slot = groups[one && !groups[0] ? 1 : g];
    out.items().push_back(slot ? slot->second : megatron::RenderedSettings(megatron::OptimizerMeta{}, g));
  }
  return out;
}

}  // namespace

Result<std::optional<megatron::OptimizerMeta>> SavedOptimizer(
    const SavedCheckpoint& saved, const std::vector<Tensor>& model, Keys keys,
    const std::function<Result<const RandomAccessFile*>(const std::string& file)>& open, const std::string& what) {
  const bool titan = keys == Keys::kTorchtitan;
  const OptimizerEntries entries(model, keys, open, what);
  megatron::OptimizerMeta meta;
  PTC_ASSIGN_OR_RETURN(meta.steps, ReadSteps(saved, entries, titan ? "optimizer.state." : "optim.state.", what));
  PTC_ASSIGN_OR_RETURN(const SavedGroups groups,
                       ReadGroups(saved, entries, titan, titan ? "optimizer.param_groups." : "optim.param_groups.", what));
  if (groups.settings.empty()) {
    if (meta.steps.empty()) return std::nullopt;
    return meta;
  }
  PTC_ASSIGN_OR_RETURN(meta.groups, MegatronGroups(groups, entries, titan, what));
  return meta;
}

}  // namespace ptc::dcp
