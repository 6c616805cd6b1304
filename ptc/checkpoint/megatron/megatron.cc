#include "ptc/checkpoint/megatron/megatron.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "ptc/base/hex.h"
#include "ptc/checkpoint/megatron/extra.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"

namespace ptc::megatron {
namespace {

using pickle::Value;

constexpr std::string_view kGptSchema = "megatron-gpt";
constexpr std::string_view kEncoderPrefix = "language_model.encoder.";

bool ParseDigits(std::string_view text, int* out) {
  // Digits only: from_chars takes a sign ("-01" would read as -1, a missing number).
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

int64_t Numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) stride[i - 1] = stride[i] * shape[i];
  return stride;
}

Value TensorValue(const LocalTensor& t, size_t storage) {
  pickle::Tensor p;
  p.storage_key = std::to_string(storage);
  p.dtype = t.dtype;
  p.storage_numel = static_cast<uint64_t>(Numel(t.shape));
  p.shape.assign(t.shape.begin(), t.shape.end());
  p.stride = ContiguousStrides(t.shape);
  return Value::FromTensor(std::move(p));
}

// Puts leaves into a tree of dicts, creating the dicts on their way: what
// Value::Set and Find would do, without scanning a dict for each key (an
// encoder's state_dict holds every layer's tensors).
class TreeWriter {
 public:
  explicit TreeWriter(Value* root) : root_(root) {}

  // Sets the leaf at `path`; the dicts on the way are created when absent
  // (the leaf's own as an OrderedDict, as a module's state_dict is).
  void Put(const std::vector<std::string>& path, Value leaf) {
    Value* node = root_;
    std::string prefix;  // path[0..i) joined by '\0': the dict `node`
    for (size_t i = 0; i < path.size(); ++i) {
      const bool last = i + 1 == path.size();
      Value* child = Slot(prefix, node, path[i]);
      if (child == nullptr) {
        node->pairs().emplace_back(Value::Str(path[i]), last                   ? std::move(leaf)
                                                        : i + 2 == path.size() ? Value::OrderedDict()
                                                                               : Value::Dict());
        keys_[prefix].emplace(path[i], node->pairs().size() - 1);
        child = &node->pairs().back().second;
      } else if (last) {
        *child = std::move(leaf);
      }
      if (last) return;
      node = child;
      prefix += path[i];
      prefix += '\0';
    }
  }

 private:
  // The value at Str key `key` of the dict `node` (at `prefix`), or nullptr.
  Value* Slot(const std::string& prefix, Value* node, const std::string& key) {
    auto [at, fresh] = keys_.try_emplace(prefix);
    if (fresh && node->is_dict()) {  // a dict this writer did not create: index what it holds
      for (size_t k = 0; k < node->pairs().size(); ++k) {
        const Value& name = node->pairs()[k].first;
        if (name.kind() == pickle::Kind::kStr) at->second.try_emplace(name.as_str(), k);
      }
    }
    const auto found = at->second.find(key);
    return found == at->second.end() ? nullptr : &node->pairs()[found->second].second;
  }

  Value* root_;
  // Per dict (by its path), the position of each Str key in its pairs.
  std::unordered_map<std::string, std::unordered_map<std::string, size_t>> keys_;
};

const Value* Get(const Value& root, const std::vector<Value>& path, pickle::DictIndex* index) {
  const Value* node = &root;
  for (const Value& key : path) {
    if (node->is_dict()) {
      node = index->Find(*node, key);
    } else if (node->is_sequence() && key.kind() == pickle::Kind::kInt && key.as_int() >= 0 &&
               static_cast<size_t>(key.as_int()) < node->items().size()) {
      node = &node->items()[static_cast<size_t>(key.as_int())];
    } else {
      node = nullptr;
    }
    if (node == nullptr) return nullptr;
  }
  return node;
}

std::string PathText(const std::vector<Value>& path) {
  std::string out;
  for (const Value& k : path) {
    out += out.empty() ? "" : "/";
    out += k.kind() == pickle::Kind::kStr ? k.as_str() : k.DebugString();
  }
  return out;
}

std::vector<Value> StrPath(const std::vector<std::string>& keys) {
  std::vector<Value> out;
  for (const std::string& k : keys) out.push_back(Value::Str(k));
  return out;
}

}  // namespace

std::string IterationDirName(uint64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07llu", static_cast<unsigned long long>(iteration));
  return buf;
}

std::string RankDirName(int tp_rank, int pp_rank, int pp, int ep_rank, int ep) {
  char buf[48];
  if (pp == 1) {
    std::snprintf(buf, sizeof(buf), "mp_rank_%02d", tp_rank);
  } else {
    std::snprintf(buf, sizeof(buf), "mp_rank_%02d_%03d", tp_rank, pp_rank);
  }
  std::string name = buf;
  if (ep > 1) {
    std::snprintf(buf, sizeof(buf), "_%03d", ep_rank);
    name += buf;
  }
  return name;
}

Result<RankDir> ParseRankDirName(std::string_view name) {
  const auto bad = InvalidArgumentError("'" + std::string(name) +
                                        "' is not a rank directory (mp_rank_TT, mp_rank_TT_PPP, mp_rank_TT_EEE or "
                                        "mp_rank_TT_PPP_EEE)");
  if (!name.starts_with("mp_rank_")) return bad;
  std::string_view rest = name.substr(8);
  RankDir d;
  int* const fields[] = {&d.tp_rank, &d.pp_rank, &d.ep_rank};
  for (size_t f = 0;; ++f) {
    const size_t us = rest.find('_');
    const std::string_view part = rest.substr(0, us);
    if (f == 3 || !ParseDigits(part, fields[f]) || part.size() != (f == 0 ? 2u : 3u)) return bad;
    if (us == std::string_view::npos) break;
    rest = rest.substr(us + 1);
  }
  return d;
}

Status CheckLegacySave(const ParallelConfig& config) {
  if (config.expert_tp() == config.tp) return Status::OK();  // the first tp*ep ranks of a stage: every file once
  const std::string c = "config " + config.ToString() + ": Megatron's legacy save (mp_rank_*/model_optim_rng.pt) ";
  const std::string use = " (etp=" + std::to_string(config.expert_tp()) + " != tp=" + std::to_string(config.tp) +
                          "; use --ckpt-format torch_dist, or etp=tp)";
  std::set<std::tuple<int, int, int>> files, dense, experts;  // (pp, tp, ep), (pp, tp), (pp, ep, etp)
  for (int rank = 0; rank < config.world_size(); ++rank) {
    const RankCoords r = config.CoordsOf(rank);
    if (r.edp != 0) continue;
    if (!files.insert({r.pp, r.tp, r.ep}).second) {
      return FailedPreconditionError(c + "cannot hold it: two saving ranks write " +
                                     RankDirName(r.tp, r.pp, config.pp, r.ep, config.ep) + use);
    }
    dense.insert({r.pp, r.tp, 0});
    experts.insert({r.pp, r.ep, r.etp});
  }
  for (int pp = 0; pp < config.pp; ++pp) {
    for (int tp = 0; tp < config.tp; ++tp) {
      if (dense.count({pp, tp, 0}) == 0) {
        return FailedPreconditionError(c +
                                       "cannot hold it: no saving rank (expert-data-parallel rank 0) holds the "
                                       "dense shard of tp rank " +
                                       std::to_string(tp) + ", pp rank " + std::to_string(pp) + use);
      }
    }
    for (int ep = 0; ep < config.ep; ++ep) {
      for (int etp = 0; etp < config.expert_tp(); ++etp) {
        if (experts.count({pp, ep, etp}) == 0) {
          return FailedPreconditionError(c + "cannot hold it: no saving rank holds the experts of ep rank " +
                                         std::to_string(ep) + ", etp rank " + std::to_string(etp) + use);
        }
      }
    }
  }
  return Status::OK();
}

std::optional<int> LegacySaveRank(const ParallelConfig& config, int tp, int pp, int ep) {
  const int stage = config.world_size() / config.pp;
  for (int rank = pp * stage; rank < (pp + 1) * stage && rank < config.world_size(); ++rank) {
    const RankCoords r = config.CoordsOf(rank);
    if (r.edp == 0 && r.tp == tp && r.ep == ep && r.pp == pp) return rank;
  }
  return std::nullopt;
}

std::optional<std::array<int, 3>> ResolveRankDir(const RankDir& d, bool with_pp, bool with_ep) {
  const int numbers = 1 + (d.pp_rank >= 0) + (d.ep_rank >= 0);
  if (numbers != 1 + with_pp + with_ep) return std::nullopt;
  if (with_pp) return std::array<int, 3>{d.tp_rank, d.pp_rank, with_ep ? d.ep_rank : 0};
  return std::array<int, 3>{d.tp_rank, 0, with_ep ? d.pp_rank : 0};
}

std::vector<std::string> ModelKeyPath(std::string_view schema_name, std::string_view local_name) {
  std::vector<std::string> path = {"model"};
  if (schema_name != kGptSchema) {
    path.emplace_back(local_name);
    return path;
  }
  // Legacy GPTModel: nested dicts down to the modules; the encoder is one
  // module's flat state_dict ("layers.0.input_layernorm.weight").
  if (local_name.starts_with(kEncoderPrefix)) {
    path.insert(path.end(), {"language_model", "encoder", std::string(local_name.substr(kEncoderPrefix.size()))});
    return path;
  }
  for (size_t start = 0;;) {
    const size_t dot = local_name.find('.', start);
    path.emplace_back(local_name.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return path;
}

Result<RankState> BuildRankState(const ModelSpec& spec, const ParallelConfig& config, const RankView& schema_view,
                                 const MegatronState& state, NameSet names) {
  const pickle::Value& carried = state.carried;
  if (!carried.is_dict() && !carried.is_none()) {
    return InvalidArgumentError("kept checkpoint entries are a " + std::string(pickle::KindName(carried.kind())) +
                                ", not a dict");
  }
  PTC_RETURN_IF_ERROR(CheckNameSetSplits(names, config.tp, schema_view));
  RankState out;
  out.view = std::make_shared<const RankView>(ViewInNameSet(schema_view, names));
  const RankView& view = *out.view;
  out.root = carried.is_dict() ? carried : Value::Dict();
  Value& root = out.root;
  if (Value* args = root.Find("args"); args != nullptr && args->kind() == pickle::Kind::kObject) {
    const std::pair<const char*, int> sizes[] = {
        {"tensor_model_parallel_size", config.tp}, {"pipeline_model_parallel_size", config.pp},
        {"data_parallel_size", config.dp},         {"context_parallel_size", config.cp},
        {"expert_model_parallel_size", config.ep}, {"expert_tensor_parallel_size", config.expert_tp()},
        {"world_size", config.world_size()}};
    for (const auto& [name, value] : sizes) {
      if (args->GetAttr(name) != nullptr) PTC_RETURN_IF_ERROR(args->SetAttr(name, Value::Int(value)), "args");
    }
  }
  // 3, not 3.0: equal for Megatron's comparisons, and torch <= 1.13's
  // weights_only unpickler (Debian 12's) has no float opcode.
  root.Set("checkpoint_version", Value::Int(3));
  root.Set("iteration", Value::Int(static_cast<int64_t>(state.iteration)));
  auto add = [&](const LocalTensor& t) {
    Value v = TensorValue(t, out.storages.size());
    out.storages.push_back({v.tensor().storage_key, &t, nullptr});
    return v;
  };
  root.Set("model", Value::Dict());
  TreeWriter tree(&root);
  const std::vector<PlacedExtra> extras = PlaceExtras(state, view);
  std::vector<std::vector<const PlacedExtra*>> extras_after(view.model.size());
  for (const PlacedExtra& e : extras) {
    if (e.after < extras_after.size()) extras_after[e.after].push_back(&e);
  }
  for (size_t i = 0; i < view.model.size(); ++i) {
    tree.Put(ModelKeyPath(spec.schema.name, view.model[i].name), add(view.model[i]));
    for (const PlacedExtra* e : extras_after[i])
      tree.Put(ModelKeyPath(spec.schema.name, e->local_key), e->entry->value);
  }
  for (const CarriedTensor& c : state.tensors) out.storages.push_back({c.key, nullptr, &c});
  for (const PlacedExtra& e : extras) {
    for (const CarriedTensor& c : e.entry->tensors) out.storages.push_back({c.key, nullptr, &c});
  }
  if (const RankRng* rng = RngFor(state, view.coords.tp, view.coords.pp, view.coords.ep)) {
    root.Set("rng_state", rng->value);
    for (const CarriedTensor& c : rng->tensors) out.storages.push_back({c.key, nullptr, &c});
  }
  if (view.optim.empty() || config.zero == 1) {
    root.Erase("optimizer");  // the kept grad_scaler alone is no optimizer state
    return out;
  }
  RenderOptimizer(view, state.optimizer, state.iteration, spec.dims.experts > 0 && config.ep > 1, add, &out);
  return out;
}

Result<NameSet> FileNameSet(const ModelSpec& spec, const RankView& view, const pickle::Value& root,
                            const std::string& what) {
  pickle::DictIndex index;
  auto has = [&](const std::string& name) {
    return Get(root, StrPath(ModelKeyPath(spec.schema.name, name)), &index) != nullptr;
  };
  auto where = [&](const std::string& name) {
    return what + ": " + PathText(StrPath(ModelKeyPath(spec.schema.name, name)));
  };
  return RecogniseNameSet(view, has, where);
}

namespace {

// Megatron numbers the optimizer state in the order the model registers its
// parameters, which is the order of its state dict: the file's model tensors
// must come in the order of `view` (in the file's name set `names`).
// \error InvalidArgument naming the first tensor at another place.
Status CheckParameterOrder(const ModelSpec& spec, const RankView& view, const Value& root, NameSet names,
                           const std::string& what) {
  const Value* model = root.Find("model");
  if (model == nullptr) return Status::OK();
  std::unordered_map<std::string, size_t> at;  // the file's tensors' paths ('.'-joined, as local names) in order
  pickle::ForEachTensor(*model,
                        [&](const std::string& path, const pickle::Tensor&) { at.try_emplace(path, at.size()); });
  std::vector<size_t> in_file(view.model.size());
  for (size_t i = 0; i < in_file.size(); ++i) in_file[i] = i;
  auto place = [&](size_t i) {
    const auto it = at.find(view.model[i].name);
    return it == at.end() ? at.size() : it->second;
  };
  std::stable_sort(in_file.begin(), in_file.end(), [&](size_t a, size_t b) { return place(a) < place(b); });
  for (size_t k = 0; k < in_file.size(); ++k) {
    if (in_file[k] == k) continue;
    return InvalidArgumentError(
        what + ": " + PathText(StrPath(ModelKeyPath(spec.schema.name, view.model[in_file[k]].name))) +
        ": the rank's parameter " + std::to_string(k) + " in the file's order, where the schema's order in " +
        std::string(NameSetName(names)) + " names has " + view.model[k].name +
        " (Megatron numbers the optimizer state in the order the model registers its parameters: "
        "docs/megatron_format.md, \"The parameter order\")");
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<pickle::Tensor>> FindRankTensors(const ModelSpec& spec, const ParallelConfig& config,
                                                    const RankView& schema_view, const pickle::Value& root,
                                                    const std::string& what) {
  PTC_ASSIGN_OR_RETURN(const NameSet names, FileNameSet(spec, schema_view, root, what));
  PTC_RETURN_IF_ERROR(CheckNameSetSplits(names, config.tp, schema_view), what);
  std::vector<size_t> from;  // the file's parameter i is schema_view.model[from[i]]
  const RankView view = ViewInNameSet(schema_view, names, &from);
  std::vector<pickle::Tensor> out;
  pickle::DictIndex index;
  // `state_of`: what names the parameter whose optimizer state t is (empty for a parameter).
  auto take = [&](const LocalTensor& t, const std::vector<Value>& path, const std::string& state_of = {}) -> Status {
    const Value* v = Get(root, path, &index);
    const std::string where = what + ": " + PathText(path) + state_of;
    if (v == nullptr) return InvalidArgumentError(where + ": missing (tensor " + t.name + " of the rank's view)");
    if (!v->is_tensor())
      return InvalidArgumentError(where + ": a " + std::string(pickle::KindName(v->kind())) + ", not a tensor");
    const pickle::Tensor& p = v->tensor();
    if (p.dtype != t.dtype) {
      return InvalidArgumentError(where + ": dtype " + std::string(DTypeName(p.dtype)) + ", the schema says " +
                                  std::string(DTypeName(t.dtype)));
    }
    if (!std::equal(p.shape.begin(), p.shape.end(), t.shape.begin(), t.shape.end())) {
      return InvalidArgumentError(where + ": shape " + ShapeToString(Shape(p.shape.begin(), p.shape.end())) +
                                  ", the schema and config say " + ShapeToString(t.shape));
    }
    if (!IsContiguous(p)) return InvalidArgumentError(where + ": not contiguous (ptcfs imports contiguous tensors)");
    out.push_back(p);
    return Status::OK();
  };
  for (const LocalTensor& t : view.model) PTC_RETURN_IF_ERROR(take(t, StrPath(ModelKeyPath(spec.schema.name, t.name))));
  // Back in schema_view's order: out[i] is schema_view.model[i]'s (the optimizer state's order is the view's).
  std::vector<pickle::Tensor> in_schema_order(out.size());
  for (size_t i = 0; i < from.size(); ++i) in_schema_order[from[i]] = std::move(out[i]);
  out = std::move(in_schema_order);
  if (view.optim.empty()) return out;
  if (config.zero == 1) {
    return InvalidArgumentError(what +
                                ": ZeRO-1 optimizer state is not part of Megatron's model_optim_rng.pt "
                                "(import without optimizer state)");
  }
  const Value* optimizer = root.Find("optimizer");
  if (optimizer == nullptr)
    return InvalidArgumentError(what + ": optimizer: missing (the store holds optimizer state)");
  PTC_RETURN_IF_ERROR(CheckParameterOrder(spec, view, root, names, what));
  PTC_ASSIGN_OR_RETURN(OptimizerLayout layout, ReadOptimizerLayout(view, *optimizer, what));
  std::map<std::string, size_t> param_index;
  for (size_t i = 0; i < view.model.size(); ++i) param_index[view.model[i].name] = i;
  for (const LocalTensor& t : view.optim) {
    const size_t dot = t.name.rfind('.');
    const size_t i = param_index.at(t.name.substr(0, dot));
    // The state is numbered in the model's parameter order (docs/megatron_format.md): a file
    // numbered in another order misfits first at the state named here.
    PTC_RETURN_IF_ERROR(take(t, OptimizerPath(layout, t.name.substr(dot + 1), i),
                             " (the state of " + view.model[i].name + ", parameter " + std::to_string(i) +
                                 " in the schema's order in " + std::string(NameSetName(names)) + " names)"));
  }
  return out;
}

const RankRng* RngFor(const MegatronState& state, int tp, int pp, int ep) {
  if (state.rng.empty() || state.rng_tp <= 0 || state.rng_pp <= 0 || state.rng_ep <= 0) return nullptr;
  const int want_tp = tp % state.rng_tp, want_pp = pp % state.rng_pp, want_ep = ep % state.rng_ep;
  for (const RankRng& r : state.rng) {
    if (r.tp == want_tp && r.pp == want_pp && r.ep == want_ep) return &r;
  }
  return nullptr;
}

Result<std::optional<int64_t>> ArgsInt(const pickle::Value& root, std::string_view name, const std::string& what) {
  const Value* args = root.Find("args");
  if (args == nullptr || args->kind() != pickle::Kind::kObject) return std::optional<int64_t>();
  const Value* v = args->GetAttr(name);
  if (v == nullptr) return std::optional<int64_t>();
  if (v->kind() != pickle::Kind::kInt) {
    return InvalidArgumentError(what + ": args." + std::string(name) + " is a " +
                                std::string(pickle::KindName(v->kind())) + ", not an int");
  }
  return std::optional<int64_t>(v->as_int());
}

namespace {

nlohmann::json EncodeTensors(const std::vector<CarriedTensor>& list) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const CarriedTensor& t : list) {
    tensors.push_back({{"key", t.key}, {"dtype", DTypeName(t.dtype)}, {"numel", t.numel}, {"data", Hex(t.bytes)}});
  }
  return tensors;
}

// `field` (e.g. "extra.megatron.tensors") names the array in messages.
Result<std::vector<CarriedTensor>> DecodeTensors(const nlohmann::json& tensors, const std::string& field) {
  std::vector<CarriedTensor> out;
  if (!tensors.is_array()) return InvalidArgumentError(field + ": must be an array");
  for (const nlohmann::json& t : tensors) {
    const std::string label = field + "[" + std::to_string(out.size()) + "]";
    if (!t.is_object() || !t.contains("key") || !t["key"].is_string() || !t.contains("dtype") ||
        !t["dtype"].is_string() || !t.contains("numel") || !t["numel"].is_number_unsigned() || !t.contains("data") ||
        !t["data"].is_string()) {
      return InvalidArgumentError(label + ": expected {key, dtype, numel, data}");
    }
    CarriedTensor c{t["key"].get<std::string>(), DType::kU8, t["numel"].get<uint64_t>(), ""};
    PTC_ASSIGN_OR_RETURN(c.dtype, ParseDType(t["dtype"].get<std::string>()), label);
    PTC_ASSIGN_OR_RETURN(c.bytes, Unhex(t["data"].get<std::string>(), label + ".data"));
    if (c.bytes.size() != c.numel * DTypeSize(c.dtype)) {
      return InvalidArgumentError(label + ": " + std::to_string(c.bytes.size()) + " bytes for " +
                                  std::to_string(c.numel) + " elements of " + std::string(DTypeName(c.dtype)));
    }
    out.push_back(std::move(c));
  }
  return out;
}

// An optional unsigned field of `j` below `limit` (`absent` when missing).
Result<uint64_t> OptionalIndex(const nlohmann::json& j, const char* name, uint64_t absent, uint64_t limit,
                               const std::string& label) {
  if (!j.contains(name)) return absent;
  if (!j[name].is_number_unsigned() || j[name].get<uint64_t>() >= limit) {
    return InvalidArgumentError(label + "." + name + ": expected a number below " + std::to_string(limit));
  }
  return j[name].get<uint64_t>();
}

// extra.megatron.rng: {"tp": T, "pp": P, "ep": E (absent: 1), "ranks": [{"tp", "pp",
// "ep" (absent: 0), "value", "tensors"}]}, one record per (tp, pp, ep) of the grid.
// `field` names it in messages.
Status DecodeRng(const nlohmann::json& j, const std::string& field, MegatronState* state) {
  const auto bad = [&](const std::string& why) { return InvalidArgumentError(field + ": " + why); };
  if (!j.is_object() || !j.contains("tp") || !j["tp"].is_number_unsigned() || !j.contains("pp") ||
      !j["pp"].is_number_unsigned() || !j.contains("ranks") || !j["ranks"].is_array()) {
    return bad("expected {tp, pp, ranks}");
  }
  const uint64_t tp = j["tp"].get<uint64_t>(), pp = j["pp"].get<uint64_t>();
  PTC_ASSIGN_OR_RETURN(const uint64_t ep, OptionalIndex(j, "ep", 1, (1 << 16) + 1, field));
  if (tp == 0 || pp == 0 || ep == 0 || tp > 1 << 16 || pp > 1 << 16 || j["ranks"].size() != tp * pp * ep) {
    return bad("a " + std::to_string(tp) + " x " + std::to_string(pp) + " x " + std::to_string(ep) +
               " grid needs as many records, not " + std::to_string(j["ranks"].size()));
  }
  state->rng_tp = static_cast<int>(tp);
  state->rng_pp = static_cast<int>(pp);
  state->rng_ep = static_cast<int>(ep);
  std::vector<bool> seen(tp * pp * ep, false);
  for (const nlohmann::json& r : j["ranks"]) {
    const std::string label = field + ".ranks[" + std::to_string(state->rng.size()) + "]";
    if (!r.is_object() || !r.contains("tp") || !r["tp"].is_number_unsigned() || !r.contains("pp") ||
        !r["pp"].is_number_unsigned() || !r.contains("value") || !r["value"].is_string()) {
      return InvalidArgumentError(label + ": expected {tp, pp, value, tensors}");
    }
    const uint64_t t = r["tp"].get<uint64_t>(), p = r["pp"].get<uint64_t>();
    PTC_ASSIGN_OR_RETURN(const uint64_t e, OptionalIndex(r, "ep", 0, ep, label));
    if (t >= tp || p >= pp || seen[(e * pp + p) * tp + t]) {
      return InvalidArgumentError(label + ": rank (" + std::to_string(t) + ", " + std::to_string(p) + ", ep " +
                                  std::to_string(e) + ") is outside the grid or repeated");
    }
    seen[(e * pp + p) * tp + t] = true;
    RankRng rng;
    rng.tp = static_cast<int>(t);
    rng.pp = static_cast<int>(p);
    rng.ep = static_cast<int>(e);
    PTC_ASSIGN_OR_RETURN(std::string pickled, Unhex(r["value"].get<std::string>(), label + ".value"));
    PTC_ASSIGN_OR_RETURN(rng.value, pickle::Unpickle(pickled, label + ".value"));
    if (r.contains("tensors")) {
      PTC_ASSIGN_OR_RETURN(rng.tensors, DecodeTensors(r["tensors"], label + ".tensors"));
    }
    state->rng.push_back(std::move(rng));
  }
  return Status::OK();
}

// extra.megatron.optimizer: {"groups": pickled list of settings dicts,
// "steps": [{"params": [global names], "value", "tensors"}], "expert_groups"
// (absent: none kept): pickled list of two settings dicts or None}.
Status DecodeOptimizer(const nlohmann::json& j, const std::string& field, OptimizerMeta* meta) {
  if (!j.is_object() || !j.contains("groups") || !j["groups"].is_string() || !j.contains("steps") ||
      !j["steps"].is_array()) {
    return InvalidArgumentError(field + ": expected {groups, steps}");
  }
  PTC_ASSIGN_OR_RETURN(std::string pickled, Unhex(j["groups"].get<std::string>(), field + ".groups"));
  PTC_ASSIGN_OR_RETURN(meta->groups, pickle::Unpickle(pickled, field + ".groups"));
  if (meta->groups.kind() != pickle::Kind::kList || meta->groups.items().size() > 2) {
    return InvalidArgumentError(field + ".groups: a list of at most two groups expected");
  }
  if (j.contains("expert_groups")) {
    const std::string label = field + ".expert_groups";
    if (!j["expert_groups"].is_string()) return InvalidArgumentError(label + ": a string expected");
    PTC_ASSIGN_OR_RETURN(std::string experts, Unhex(j["expert_groups"].get<std::string>(), label));
    PTC_ASSIGN_OR_RETURN(meta->expert_groups, pickle::Unpickle(experts, label));
    const pickle::Value& e = meta->expert_groups;
    if (e.kind() != pickle::Kind::kList || e.items().size() != 2 ||
        !std::all_of(e.items().begin(), e.items().end(), [](const Value& g) { return g.is_dict() || g.is_none(); })) {
      return InvalidArgumentError(label + ": a list of two groups (a settings dict or None) expected");
    }
  }
  for (const nlohmann::json& s : j["steps"]) {
    const std::string label = field + ".steps[" + std::to_string(meta->steps.size()) + "]";
    if (!s.is_object() || !s.contains("params") || !s["params"].is_array() || !s.contains("value") ||
        !s["value"].is_string() || !s.contains("tensors")) {
      return InvalidArgumentError(label + ": expected {params, value, tensors}");
    }
    StepValue step;
    for (const nlohmann::json& p : s["params"]) {
      if (!p.is_string()) return InvalidArgumentError(label + ".params: strings expected");
      step.params.push_back(p.get<std::string>());
    }
    PTC_ASSIGN_OR_RETURN(std::string value, Unhex(s["value"].get<std::string>(), label + ".value"));
    PTC_ASSIGN_OR_RETURN(step.value, pickle::Unpickle(value, label + ".value"));
    PTC_ASSIGN_OR_RETURN(step.tensors, DecodeTensors(s["tensors"], label + ".tensors"));
    if (step.value.is_tensor() != (step.tensors.size() == 1) ||
        (step.value.is_tensor() && step.value.tensor().storage_key != step.tensors[0].key)) {
      return InvalidArgumentError(label + ": a tensor value needs its one storage, a number none");
    }
    meta->steps.push_back(std::move(step));
  }
  return Status::OK();
}

// extra.megatron.extra_state: {"tp": T, "entries": [{"tp", "key", "anchor", "value", "tensors"}]}
// (ptc/checkpoint/megatron/extra.h).
Status DecodeExtras(const nlohmann::json& j, const std::string& field, MegatronState* state) {
  if (!j.is_object() || !j.contains("tp") || !j["tp"].is_number_unsigned() || !j.contains("entries") ||
      !j["entries"].is_array()) {
    return InvalidArgumentError(field + ": expected {tp, entries}");
  }
  const uint64_t tp = j["tp"].get<uint64_t>();
  if (tp == 0 || tp > 1 << 16) return InvalidArgumentError(field + ".tp: " + std::to_string(tp) + " is no tp size");
  state->extra_tp = static_cast<int>(tp);
  for (const nlohmann::json& e : j["entries"]) {
    const std::string label = field + ".entries[" + std::to_string(state->extra.size()) + "]";
    if (!e.is_object() || !e.contains("tp") || !e["tp"].is_number_unsigned() || e["tp"].get<uint64_t>() >= tp ||
        !e.contains("key") || !e["key"].is_string() || !e.contains("anchor") || !e["anchor"].is_string() ||
        !e.contains("value") || !e["value"].is_string() || !e.contains("tensors")) {
      return InvalidArgumentError(label + ": expected {tp (below " + std::to_string(tp) +
                                  "), key, anchor, value, tensors}");
    }
    ExtraEntry entry{static_cast<int>(e["tp"].get<uint64_t>()),
                     e["key"].get<std::string>(),
                     e["anchor"].get<std::string>(),
                     Value(),
                     {}};
    PTC_ASSIGN_OR_RETURN(std::string pickled, Unhex(e["value"].get<std::string>(), label + ".value"));
    PTC_ASSIGN_OR_RETURN(entry.value, pickle::Unpickle(pickled, label + ".value"));
    PTC_ASSIGN_OR_RETURN(entry.tensors, DecodeTensors(e["tensors"], label + ".tensors"));
    state->extra.push_back(std::move(entry));
  }
  return Status::OK();
}

nlohmann::json EncodeOptimizer(const OptimizerMeta& meta) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepValue& s : meta.steps) {
    steps.push_back(
        {{"params", s.params}, {"value", Hex(pickle::Pickle(s.value))}, {"tensors", EncodeTensors(s.tensors)}});
  }
  nlohmann::json j = {{"groups", Hex(pickle::Pickle(meta.groups))}, {"steps", std::move(steps)}};
  if (!meta.expert_groups.items().empty()) j["expert_groups"] = Hex(pickle::Pickle(meta.expert_groups));
  return j;
}

}  // namespace

Result<MegatronState> LoadMegatronState(const nlohmann::json& extra, const std::string& what) {
  MegatronState state;
  auto it = extra.find(kManifestKey);
  if (it == extra.end()) return state;
  const auto bad = [&](const std::string& why) { return InvalidArgumentError(what + ": extra.megatron: " + why); };
  if (!it->is_object()) return bad("not an object");
  auto iteration = it->find("iteration");
  auto carried = it->find("carried");
  if (iteration == it->end() || !iteration->is_number_unsigned())
    return bad("'iteration' must be a non-negative integer");
  if (carried == it->end() || !carried->is_string()) return bad("'carried' must be a string");
  state.iteration = iteration->get<uint64_t>();
  PTC_ASSIGN_OR_RETURN(std::string pickled, Unhex(carried->get<std::string>(), what + ": extra.megatron.carried"));
  PTC_ASSIGN_OR_RETURN(state.carried, pickle::Unpickle(pickled, what + ": extra.megatron.carried"));
  if (auto rng = it->find("rng"); rng != it->end()) {
    PTC_RETURN_IF_ERROR(DecodeRng(*rng, what + ": extra.megatron.rng", &state));
  }
  if (auto optimizer = it->find("optimizer"); optimizer != it->end()) {
    PTC_RETURN_IF_ERROR(DecodeOptimizer(*optimizer, what + ": extra.megatron.optimizer", &state.optimizer));
  }
  if (auto extra = it->find("extra_state"); extra != it->end()) {
    PTC_RETURN_IF_ERROR(DecodeExtras(*extra, what + ": extra.megatron.extra_state", &state));
  }
  auto tensors = it->find("tensors");
  if (tensors == it->end()) return state;
  if (!tensors->is_array()) return bad("'tensors' must be an array");
  PTC_ASSIGN_OR_RETURN(state.tensors, DecodeTensors(*tensors, what + ": extra.megatron.tensors"));
  return state;
}

nlohmann::json EncodeMegatronState(const MegatronState& state) {
  nlohmann::json j = {{"iteration", state.iteration},
                      {"carried", Hex(pickle::Pickle(state.carried))},
                      {"tensors", EncodeTensors(state.tensors)}};
  if (!state.optimizer.groups.items().empty() || !state.optimizer.steps.empty() ||
      !state.optimizer.expert_groups.items().empty()) {
    j["optimizer"] = EncodeOptimizer(state.optimizer);
  }
  if (state.extra_tp > 0) {
    nlohmann::json entries = nlohmann::json::array();
    for (const ExtraEntry& e : state.extra) {
      entries.push_back({{"tp", static_cast<uint64_t>(e.tp)},
                         {"key", e.key},
                         {"anchor", e.anchor},
                         {"value", Hex(pickle::Pickle(e.value))},
                         {"tensors", EncodeTensors(e.tensors)}});
    }
    j["extra_state"] = {{"tp", static_cast<uint64_t>(state.extra_tp)}, {"entries", std::move(entries)}};
  }
  if (!state.rng.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const RankRng& r : state.rng) {
      ranks.push_back({{"tp", static_cast<uint64_t>(r.tp)},
                       {"pp", static_cast<uint64_t>(r.pp)},
                       {"value", Hex(pickle::Pickle(r.value))},
                       {"tensors", EncodeTensors(r.tensors)}});
      if (r.ep != 0) ranks.back()["ep"] = static_cast<uint64_t>(r.ep);
    }
    j["rng"] = {{"tp", static_cast<uint64_t>(state.rng_tp)},
                {"pp", static_cast<uint64_t>(state.rng_pp)},
                {"ranks", std::move(ranks)}};
    if (state.rng_ep > 1) j["rng"]["ep"] = static_cast<uint64_t>(state.rng_ep);
  }
  return j;
}

void PointAtOwnStorage(const std::string& key, pickle::Tensor& t) {
  t.storage_key = key;
  t.storage_numel = TensorNumElements(t);
  t.storage_offset = 0;
  t.stride.assign(t.shape.size(), 1);
  for (size_t d = t.shape.size(); d-- > 1;) t.stride[d - 1] = t.stride[d] * t.shape[d];
}

pickle::Value CarriedEntries(const pickle::Value& root) {
  Value carried = root;
  carried.Erase("model");
  // Megatron's other optimizer entries (grad_scaler) are kept beside the
  // state ptcfs reads; an optimizer entry in another layout is not imported.
  Value* optimizer = carried.Find("optimizer");
  if (optimizer != nullptr && optimizer->is_dict() && optimizer->Erase("optimizer") &&
      optimizer->Erase("fp32_from_fp16_params") && !optimizer->pairs().empty()) {
    return carried;
  }
  carried.Erase("optimizer");
  return carried;
}

}  // namespace ptc::megatron
