#include "ptc/checkpoint/dcp/dcp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/base/crc32.h"
#include "ptc/format/pickle.h"
#include "ptc/model/view.h"
#include "ptc/store/model_spec.h"

namespace ptc::dcp {
namespace {

using pickle::Value;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

// A tensor of `m` that is optimizer state of a parameter of `m`: P and the kind.
std::optional<std::pair<std::string, std::string>> OptimizerStateOf(const std::string& name,
                                                                    const std::set<std::string>& names) {
  for (const char* kind : kOptimizerKinds) {
    const std::string suffix = std::string(".") + kind;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      std::string param = name.substr(0, name.size() - suffix.size());
      if (names.count(param) != 0) return std::make_pair(std::move(param), std::string(kind));
    }
  }
  return std::nullopt;
}

std::string DistcpName(int worker, int index) {
  return "__" + std::to_string(worker) + "_" + std::to_string(index) + ".distcp";
}

Value Ints(const std::vector<Index>& v) {
  pickle::Items items;
  for (Index i : v) items.push_back(Value::Int(i));
  return Value::Tuple(std::move(items));
}

// An object as dataclasses pickle: cls.__new__(cls), then its __dict__ (BUILD).
Value DataObject(const char* module, const char* name, Value state) {
  pickle::Object o;
  o.callable = {module, name};
  o.build = pickle::Object::Build::kNewObj;
  o.state = pickle::Boxed<Value>(std::move(state));
  return Value::FromObject(std::move(o));
}

Value Call(const char* module, const char* name, pickle::Items args) {
  pickle::Object o;
  o.callable = {module, name};
  o.args = std::move(args);
  return Value::FromObject(std::move(o));
}

Value TorchSize(const std::vector<Index>& v) { return Call("torch", "Size", {Ints(v)}); }

// torch.save of `root`, whole; `storages` hold the bytes of the tensors it references.
Result<std::string> TorchBytes(const Value& root, const std::string& archive,
                               const std::vector<megatron::CarriedTensor>& storages) {
  std::vector<TorchStorageSpec> specs;
  for (const megatron::CarriedTensor& c : storages) {
    specs.push_back({c.key, c.dtype, c.numel, Crc32(0, c.bytes.data(), c.bytes.size())});
  }
  PTC_ASSIGN_OR_RETURN(TorchFilePlan file, PlanTorchFile(archive, root, specs));
  for (size_t i = 0; i < storages.size(); ++i) file.contents[file.storage_members[i]] = storages[i].bytes;
  PTC_ASSIGN_OR_RETURN(ZipLayout layout, LayoutTorchFile(file));
  std::string out;
  for (const ZipPiece& piece : layout.pieces) {
    out += piece.is_literal() ? std::string_view(piece.literal)
                              : std::string_view(file.contents[static_cast<size_t>(piece.member)])
                                    .substr(piece.member_offset, piece.size);
  }
  return out;
}

// TensorProperties pickles its __getstate__ tuple: dtype, layout, requires_grad,
// memory format (an enum member), pin_memory, strides.
Value Properties(DType dtype, const Shape& shape) {
  pickle::Items state;
  state.push_back(Value::FromGlobal({"torch", std::string(pickle::TorchDTypeName(dtype))}));
  state.push_back(Call("torch.serialization", "_get_layout", {Value::Str("torch.strided")}));
  state.push_back(Value::Bool(false));
  state.push_back(
      Call("builtins", "getattr",
           {Value::FromGlobal({kMetadataModule, "_MEM_FORMAT_ENCODING"}), Value::Str("TORCH_CONTIGUOUS_FORMAT")}));
  state.push_back(Value::Bool(false));
  state.push_back(Ints(RowMajorStrides(shape)));
  return DataObject(kMetadataModule, "TensorProperties", Value::Tuple(std::move(state)));
}

// A chunk's MetadataIndex and _StorageInfo (storage_data's key and value).
Value ChunkIndex(const std::string& key, Value offset, Value index) {
  return DataObject(kMetadataModule, "MetadataIndex",
                    Value::Dict({{Value::Str("fqn"), Value::Str(key)},
                                 {Value::Str("offset"), std::move(offset)},
                                 {Value::Str("index"), std::move(index)}}));
}
Value ChunkInfo(const std::string& file, const Chunk& c) {
  return DataObject("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                    Value::Dict({{Value::Str("relative_path"), Value::Str(file)},
                                 {Value::Str("offset"), Value::Int(static_cast<int64_t>(c.offset))},
                                 {Value::Str("length"), Value::Int(static_cast<int64_t>(c.size))}}));
}

}  // namespace

std::vector<std::pair<Box, size_t>> DisjointBoxes(const std::vector<Box>& stored) {
  std::vector<std::pair<Box, size_t>> out;
  for (size_t i = 0; i < stored.size(); ++i) {
    std::vector<Box> rest = {stored[i]};
    for (size_t j = 0; j < i && !rest.empty(); ++j) {
      if (!Intersect(stored[i], stored[j])) continue;
      std::vector<Box> next;
      for (const Box& r : rest) {
        for (Box& part : Subtract(r, stored[j])) next.push_back(std::move(part));
      }
      rest = std::move(next);
    }
    for (Box& r : rest) out.emplace_back(std::move(r), i);
  }
  return out;
}

Shape KeyShape(const Tensor& t) {
  if (t.layer < 0) return t.shape;
  Shape shape = {t.layers};
  if (t.expert >= 0) shape.push_back(t.experts);
  shape.insert(shape.end(), t.shape.begin(), t.shape.end());
  return shape;
}

Box KeyBox(const Tensor& t, const Box& box) {
  if (t.layer < 0) return box;
  Box out = box;
  if (t.expert >= 0) {
    out.begin.insert(out.begin.begin(), t.expert);
    out.end.insert(out.end.begin(), t.expert + 1);
  }
  out.begin.insert(out.begin.begin(), t.layer);
  out.end.insert(out.end.begin(), t.layer + 1);
  return out;
}

namespace {

// "decoder.layers.I.REST" -> ("decoder.layers.REST", I).
std::optional<std::pair<std::string, Index>> LayerOf(const std::string& name) {
  constexpr std::string_view kLayers = "decoder.layers.";
  if (name.rfind(kLayers, 0) != 0) return std::nullopt;
  size_t i = kLayers.size();
  Index layer = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (Index{1} << 40)) {
    layer = layer * 10 + (name[i++] - '0');
  }
  if (i == kLayers.size() || i >= name.size() || name[i] != '.') return std::nullopt;
  return std::make_pair(std::string(kLayers) + name.substr(i + 1), layer);
}

constexpr std::string_view kLocalExperts = "decoder.layers.mlp.experts.local_experts.";

// Megatron-Core's key of a layer tensor's stacked key "decoder.layers.REST":
// a routed expert's (SequentialMLP's sharded_state_dict: its experts stacked
// too, "decoder.layers.mlp.experts.experts.X") and its expert; an MoE layer's
// own norm under the name the local spec maps it to (its
// sharded_state_dict_keys_map: pre_mlp_layernorm. -> mlp.linear_fc1.layer_norm_),
// the key of a dense layer's fused norm; else the key itself and -1.
std::pair<std::string, Index> McoreLayerKey(const std::string& key) {
  if (key.rfind(kLocalExperts, 0) == 0) {
    const size_t dot = key.find('.', kLocalExperts.size());
    Index e = 0;
    size_t i = kLocalExperts.size();
    while (i < dot && i < key.size() && key[i] >= '0' && key[i] <= '9' && e < (Index{1} << 40)) {
      e = e * 10 + (key[i++] - '0');
    }
    if (dot != std::string::npos && i == dot && dot > kLocalExperts.size()) {
      return {"decoder.layers.mlp.experts.experts." + key.substr(dot + 1), e};
    }
  }
  constexpr std::string_view kPreMlp = "decoder.layers.pre_mlp_layernorm.";
  if (key.rfind(kPreMlp, 0) == 0) return {"decoder.layers.mlp.linear_fc1.layer_norm_" + key.substr(kPreMlp.size()), -1};
  return {key, -1};
}

// The key of `t` (name, dtype and shape set) under `keys`; its path, layer and
// layers (and expert and experts).
void NameKey(Keys keys, const std::set<std::string>& names, Index layers, Index experts, bool chained, Tensor& t) {
  const auto state = OptimizerStateOf(t.name, names);
  if (keys == Keys::kTorch) {
    t.path = state ? std::vector<std::string>{"optim", "state", state->first, state->second}
                   : std::vector<std::string>{"model", t.name};
    for (const std::string& part : t.path) t.key += (t.key.empty() ? "" : ".") + part;
    return;
  }
  const std::string param = state ? state->first : t.name;
  std::string key = param;
  if (auto layer = LayerOf(param)) {
    Index expert = -1;
    std::tie(key, expert) = McoreLayerKey(layer->first);
    t.layer = layer->second;
    t.layers = layers;
    if (expert >= 0) {
      t.expert = expert;
      t.experts = experts;
    }
  }
  if (state) {
    key = "optimizer.state." + (state->second == "fp32" ? std::string("fp32_param") : state->second) + "." + key;
    if (chained) key = std::string(kChainedPrefix) + (t.expert >= 0 ? "1." : "0.") + key;
  }
  t.key = key;
  t.path = {key};
}

}  // namespace

std::pair<std::string_view, int> WithoutChainedPrefix(std::string_view key) {
  if (!key.starts_with(kChainedPrefix)) return {key, -1};
  const size_t dot = key.find('.', kChainedPrefix.size());
  const std::string_view n =
      dot == std::string_view::npos ? "" : key.substr(kChainedPrefix.size(), dot - kChainedPrefix.size());
  if (n != "0" && n != "1") return {key, -1};
  return {key.substr(dot + 1), n[0] - '0'};
}

std::string TeSpecNormKey(const Tensor& t) {
  constexpr std::string_view kFused = "decoder.layers.mlp.linear_fc1.layer_norm_";
  constexpr std::string_view kOwn = "decoder.layers.pre_mlp_layernorm.";
  const size_t at = t.key.find(kFused);
  if (t.layer < 0 || at == std::string::npos || t.name.find(".pre_mlp_layernorm.") == std::string::npos) return "";
  return t.key.substr(0, at) + std::string(kOwn) + t.key.substr(at + kFused.size());
}

std::vector<Tensor> NameTensors(const std::vector<TensorRecord>& tensors, Keys keys, bool chained) {
  std::set<std::string> names;
  Index layers = 0, experts = 0;
  for (const TensorRecord& t : tensors) {
    names.insert(t.name);
    if (auto layer = LayerOf(t.name)) {
      layers = std::max(layers, layer->second + 1);
      experts = std::max(experts, McoreLayerKey(layer->first).second + 1);
    }
  }
  std::vector<Tensor> out;
  for (const TensorRecord& t : tensors) {
    out.push_back(Tensor{t.name, "", {}, t.dtype, t.shape});
    NameKey(keys, names, layers, experts, chained && keys == Keys::kMegatronCore && experts > 0, out.back());
  }
  return out;
}

namespace {

// The tensors of `m` named in `keys`.
Result<std::vector<Tensor>> PlanNames(const GenerationManifest& m, Keys keys, bool chained) {
  if (keys != Keys::kTorchtitan) return NameTensors(m.tensors, keys, chained);
  PTC_ASSIGN_OR_RETURN(const ModelSpec spec, SpecFromManifest(m));
  return TorchtitanTensors(spec);
}

// `named` into plan->tensors, each (key, layer) once, a key's tensors alike
// and a stacked key in every layer. Returns the number of layers.
// \error InvalidArgument naming the tensor or key at fault.
Result<Index> AddPlanTensors(std::vector<Tensor> named, Plan* plan) {
  Index layers = 0;
  std::map<std::tuple<std::string, Index, Index>, size_t> keys_seen;  // (key, layer, expert) -> tensor
  // A mixture-of-experts model's stacked keys hold the layers of their kind (dense or MoE) only.
  const bool moe = std::any_of(named.begin(), named.end(), [](const Tensor& t) { return t.expert >= 0; });
  std::map<std::string, size_t> first_of_key;
  std::map<std::string, std::set<Index>> layers_of_key;
  for (Tensor& d : named) {
    layers = std::max(layers, d.layers);
    if (!keys_seen.emplace(std::make_tuple(d.key, d.layer, d.expert), plan->tensors.size()).second) {
      return InvalidArgumentError("tensor " + d.name + ": DCP key " + d.key + " repeats");
    }
    auto [first, inserted] = first_of_key.try_emplace(d.key, plan->tensors.size());
    if (!inserted) {
      const Tensor& f = plan->tensors[first->second];
      if (f.dtype != d.dtype || f.shape != d.shape || (f.layer < 0) != (d.layer < 0) ||
          (f.expert < 0) != (d.expert < 0) || f.layers != d.layers) {
        return InvalidArgumentError("tensor " + d.name + " and " + f.name + " share the key " + d.key +
                                    " but differ in dtype or shape");
      }
    }
    if (d.layer >= 0) layers_of_key[d.key].insert(d.layer);
    plan->tensors.push_back(std::move(d));
  }
  // Each stacked slice once (layers, or torchtitan's experts); a mixture-of-experts
  // model's Megatron-Core keys hold the layers of their kind (dense or MoE) only.
  for (const auto& [key, seen] : layers_of_key) {
    const Index stacked = plan->tensors[first_of_key.at(key)].layers;
    if (!moe && (static_cast<Index>(seen.size()) != stacked || *seen.rbegin() >= stacked)) {
      return InvalidArgumentError("DCP key " + key + " has " + std::to_string(seen.size()) + " of its " +
                                  std::to_string(stacked) + " stacked slices (layers or experts)");
    }
  }
  return layers;
}

// Boxes of a global tensor with the workers that store them.
using WorkerBoxes = std::vector<std::pair<Box, int>>;

// Of each global tensor a key of `plan` holds: disjoint boxes covering it,
// with their workers. The stored boxes are taken in box order (then worker):
// the plan does not depend on the order of the manifest's records, which a
// compaction's threads write in any order (the rank files of
// view/rank_files.h are laid out before).
// \error InvalidArgument naming the tensor whose pieces do not cover it.
Result<std::map<std::string, WorkerBoxes>> DisjointCover(const GenerationManifest& m, const Plan& plan) {
  std::map<std::string, const TensorRecord*> records;
  for (const TensorRecord& t : m.tensors) records[t.name] = &t;
  std::map<std::string, WorkerBoxes> stored_pairs;
  for (const ShardRecord& s : m.shards) {
    if (records.count(s.tensor) == 0) {
      return InvalidArgumentError("a stored piece of " + s.tensor + ", which is not a tensor");
    }
    for (const Box& b : s.boxes) stored_pairs[s.tensor].emplace_back(b, s.worker);
  }
  std::map<std::string, WorkerBoxes> disjoint;
  for (const Tensor& tensor : plan.tensors) {
    auto [it, inserted] = disjoint.try_emplace(tensor.name);
    if (!inserted) continue;
    auto rec = records.find(tensor.name);
    if (rec == records.end()) return InvalidArgumentError("tensor " + tensor.name + " is not in the generation");
    const Shape& shape = rec->second->shape;
    const Box full = Box::Full(shape);
    WorkerBoxes& pairs = stored_pairs[tensor.name];
    std::sort(pairs.begin(), pairs.end());
    std::vector<Box> boxes;
    for (const auto& [box, worker] : pairs) boxes.push_back(box);
    Index covered = 0;
    for (auto& [box, source] : DisjointBoxes(boxes)) {
      if (!Contains(full, box)) {
        return InvalidArgumentError("tensor " + tensor.name + ": stored box " + box.ToString() + " lies outside " +
                                    ShapeToString(shape));
      }
      covered += box.volume();
      it->second.emplace_back(std::move(box), pairs[source].second);
    }
    if (covered != full.volume()) {
      return InvalidArgumentError("tensor " + tensor.name + ": the stored pieces hold " + std::to_string(covered) +
                                  " of its " + std::to_string(full.volume()) + " elements");
    }
  }
  return disjoint;
}

// The files of a plan as chunks are added: each worker's first file, and a
// second for chunks that are not a whole stored box (woven, or a block's
// part of one), so that its first may be a rank file (view/rank_files.h).
class PlanFiles {
 public:
  Status Add(const Tensor& tensor, size_t t, Box box, int worker, bool apart) {
    PTC_ASSIGN_OR_RETURN(TorchFilePlan chunk_file, ChunkFile(tensor.dtype, KeyBox(tensor, box)),
                         "tensor " + tensor.name);
    PTC_ASSIGN_OR_RETURN(ZipLayout layout, LayoutTorchFile(chunk_file), "tensor " + tensor.name);
    File& f = files_[{worker, apart ? 1 : 0}];
    if (f.name.empty()) {
      f.name = DistcpName(worker, apart ? 1 : 0);
      f.worker = worker;
    }
    f.chunks.push_back(Chunk{t, std::move(box), f.size, layout.size});
    f.size += layout.size;
    return Status::OK();
  }
  // Tensor `t` of `plan` stored as `boxes`, a chunk per box; blocks of rows:
  // one taken whole (n = 1) is cut where its rows are stored, a woven one is
  // one chunk, in the file of its first row's worker.
  Status AddTensor(const Plan& plan, size_t t, const WorkerBoxes& boxes) {
    const Tensor& tensor = plan.tensors[t];
    if (tensor.blocks.empty()) {
      for (const auto& [box, worker] : boxes) PTC_RETURN_IF_ERROR(Add(tensor, t, box, worker, /*apart=*/false));
      return Status::OK();
    }
    for (const RowBlock& b : tensor.blocks) {
      const Index shift = b.dst - b.src.front();
      for (const auto& [box, worker] : boxes) {
        Box part = box;
        part.begin[0] = std::max(box.begin[0], b.src.front());
        part.end[0] = std::min(box.end[0], b.src.front() + (b.src.size() == 1 ? b.rows : 1));
        if (part.begin[0] >= part.end[0]) continue;
        if (b.src.size() > 1) {
          if (std::any_of(part.begin.begin() + 1, part.begin.end(), [](Index i) { return i != 0; })) continue;
          Box whole = Box::Full(tensor.shape);
          whole.begin[0] = b.dst;
          whole.end[0] = b.dst + b.rows;
          PTC_RETURN_IF_ERROR(Add(tensor, t, std::move(whole), worker, /*apart=*/true));
          break;
        }
        const bool apart = !(part == box);
        part.begin[0] += shift;
        part.end[0] += shift;
        PTC_RETURN_IF_ERROR(Add(tensor, t, std::move(part), worker, apart));
      }
    }
    return Status::OK();
  }
  // In (worker, first or second) order.
  std::vector<File> Take() {
    std::vector<File> out;
    for (auto& [where, f] : files_) out.push_back(std::move(f));
    return out;
  }

 private:
  std::map<std::pair<int, int>, File> files_;  // by (worker, 0 or 1: its first or second file)
};

// The `_extra_state` objects of a mixture-of-experts model's linears that
// Megatron-Core's loader asks for: each routed expert's
// ("decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_L.E_LAYERS.EXPERTS")
// and the shared experts' (".../shard_L_LAYERS"), `none` each.
void AddMoeObjects(const Plan& plan, const std::string& none, std::vector<Object>* objects) {
  std::set<std::string> seen;
  for (const Tensor& t : plan.tensors) {
    const bool expert = t.expert >= 0;
    if (t.layer < 0 || WithoutChainedPrefix(t.key).first.starts_with("optimizer.") || !t.key.ends_with(".weight") ||
        (!expert && t.key.rfind("decoder.layers.mlp.shared_experts.", 0) != 0)) {
      continue;
    }
    const std::string module = t.key.substr(0, t.key.size() - std::string_view(".weight").size());
    const std::string key = module + "._extra_state/shard_" +
                            (expert ? std::to_string(t.layer) + "." + std::to_string(t.expert) + "_" +
                                          std::to_string(t.layers) + "." + std::to_string(t.experts)
                                    : std::to_string(t.layer) + "_" + std::to_string(t.layers));
    if (seen.insert(key).second) objects->push_back(Object{key, none});
  }
}

// The objects of `m` in `keys` (Megatron-Core's extra states; Adam's steps
// and groups; the entries the last DCP save carried), in the plan's first
// file after its tensors.
Status AddPlanObjects(const GenerationManifest& m, Keys keys, Index layers, Plan* plan) {
  std::vector<Object> objects;
  if (keys == Keys::kMegatronCore && layers > 0) {
    PTC_ASSIGN_OR_RETURN(const std::string none, TorchSaveBytes(Value::List({Value::None()})));
    for (Index layer = 0; layer < layers; ++layer) {
      for (const char* module : {"self_attention.linear_proj", "self_attention.linear_qkv",
                                 "self_attention.core_attention", "mlp.linear_fc1", "mlp.linear_fc2"}) {
        objects.push_back(Object{std::string("decoder.layers.") + module + "._extra_state/shard_" +
                                     std::to_string(layer) + "_" + std::to_string(layers),
                                 none});
      }
    }
    AddMoeObjects(*plan, none, &objects);
  }
  const bool optimizer = std::any_of(plan->tensors.begin(), plan->tensors.end(), [](const Tensor& t) {
    return t.path.front() == "optim" || t.path.front() == "optimizer";
  });
  if (keys != Keys::kMegatronCore && optimizer) {
    PTC_ASSIGN_OR_RETURN(const megatron::MegatronState state,
                         megatron::LoadMegatronState(m.extra, "the generation's megatron state"));
    PTC_ASSIGN_OR_RETURN(objects, OptimizerObjects(plan->tensors, keys, state.optimizer, state.iteration));
  }
  if (keys != Keys::kMegatronCore) {  // what the last DCP save held beside the model (dcp/entries.h)
    PTC_ASSIGN_OR_RETURN(const std::vector<CarriedEntry> entries, EntriesOf(m.extra, "the generation's manifest"));
    for (Object& o : EntryObjects(entries)) objects.push_back(std::move(o));
    if (keys == Keys::kTorchtitan) {  // an MoE layer's expert_bias_E the store never had: zeros
      PTC_ASSIGN_OR_RETURN(std::vector<Object> biases, ExpertBiasObjects(plan->tensors, entries));
      for (Object& o : biases) objects.push_back(std::move(o));
    }
  }
  File& f = plan->files.front();
  for (Object& o : objects) {
    f.chunks.push_back(Chunk{0, Box{}, f.size, o.bytes.size(), static_cast<int64_t>(plan->objects.size())});
    f.size += o.bytes.size();
    plan->objects.push_back(std::move(o));
  }
  return Status::OK();
}

}  // namespace

Result<Plan> PlanCheckpoint(const GenerationManifest& m, Keys keys, bool chained) {
  Plan plan;
  plan.keys = keys;
  PTC_ASSIGN_OR_RETURN(std::vector<Tensor> named, PlanNames(m, keys, chained));
  PTC_ASSIGN_OR_RETURN(const Index layers, AddPlanTensors(std::move(named), &plan));
  // An MoE layer's norm under the TE spec's key too, so that either spec's load finds it.
  for (size_t t = 0, n = plan.tensors.size(); t < n && keys == Keys::kMegatronCore; ++t) {
    std::string key = TeSpecNormKey(plan.tensors[t]);
    if (key.empty()) continue;
    Tensor alias = plan.tensors[t];
    alias.key = key;
    alias.path = {std::move(key)};
    plan.tensors.push_back(std::move(alias));
  }
  PTC_ASSIGN_OR_RETURN(const auto disjoint, DisjointCover(m, plan));
  PlanFiles files;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    PTC_RETURN_IF_ERROR(files.AddTensor(plan, t, disjoint.at(plan.tensors[t].name)));
  }
  plan.files = files.Take();
  if (plan.files.empty()) return plan;
  PTC_RETURN_IF_ERROR(AddPlanObjects(m, keys, layers, &plan));
  return plan;
}

Result<std::string> TorchSaveBytes(const Value& root, const std::vector<megatron::CarriedTensor>& storages) {
  return TorchBytes(root, "archive", storages);
}

Result<TorchFilePlan> ChunkFile(DType dtype, const Box& box) {
  pickle::Tensor t;
  t.storage_key = "0";
  t.dtype = dtype;
  t.shape = box.shape();
  t.storage_numel = static_cast<uint64_t>(NumElements(t.shape));
  t.stride = RowMajorStrides(t.shape);
  return PlanTorchFile("archive", Value::FromTensor(std::move(t)),
                       {TorchStorageSpec{"0", dtype, static_cast<uint64_t>(box.volume()), 0}});
}

std::string McoreMetadataJson() {
  return R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", )"
         R"("common_backend_version": 1})";
}

Result<std::string> McoreCommon(uint64_t iteration, const pickle::Value* args, const pickle::Value* optimizer,
                                const std::vector<megatron::CarriedTensor>& storages) {
  Value common = Value::Dict();
  if (args != nullptr) common.Set("args", *args);
  common.Set("checkpoint_version", Value::Int(3));
  common.Set("iteration", Value::Int(static_cast<int64_t>(iteration)));
  if (optimizer != nullptr) common.Set("optimizer", *optimizer);
  return TorchBytes(common, "common", storages);
}

Status AddFlatFile(std::string name, std::vector<FlatTensor> flats, std::vector<Object> objects, Plan* plan) {
  File f;
  f.name = std::move(name);
  for (FlatTensor& flat : flats) {
    PTC_ASSIGN_OR_RETURN(TorchFilePlan chunk_file, ChunkFile(flat.local.dtype, Box::Full(flat.local.shape)),
                         flat.local.name);
    PTC_ASSIGN_OR_RETURN(ZipLayout layout, LayoutTorchFile(chunk_file), flat.local.name);
    f.chunks.push_back(Chunk{0, Box{}, f.size, layout.size, -1, static_cast<int64_t>(plan->flats.size())});
    f.size += layout.size;
    plan->flats.push_back(std::move(flat));
  }
  for (Object& o : objects) {
    f.chunks.push_back(Chunk{0, Box{}, f.size, o.bytes.size(), static_cast<int64_t>(plan->objects.size())});
    f.size += o.bytes.size();
    plan->objects.push_back(std::move(o));
  }
  plan->files.push_back(std::move(f));
  return Status::OK();
}

std::string EncodeMetadata(const Plan& plan) {
  // One entry per key, in the order keys first appear; its tensors' chunks in it.
  std::vector<size_t> entry_of(plan.tensors.size());
  std::vector<size_t> first;  // per entry: its first tensor
  std::map<std::string, size_t> entries;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    auto [it, inserted] = entries.try_emplace(plan.tensors[t].key, first.size());
    if (inserted) first.push_back(t);
    entry_of[t] = it->second;
  }
  std::vector<pickle::Items> chunks(first.size());
  std::vector<int64_t> count(first.size(), 0);
  pickle::Pairs storage;
  pickle::Pairs objects, object_paths, flats;
  for (const File& f : plan.files) {
    for (const Chunk& c : f.chunks) {
      if (c.object >= 0) {
        const Object& o = plan.objects[static_cast<size_t>(c.object)];
        const std::string& key = o.key;
        // A tensor: one chunk at offsets (0, ...) of its size (a 0-dim one: ()), as DCP writes a plain tensor.
        const Value empty = TorchSize(std::vector<Index>(o.shape.size(), 0));
        const Value size = TorchSize(o.shape);
        objects.emplace_back(
            Value::Str(key),
            o.scalar
                ? DataObject(kMetadataModule, "TensorStorageMetadata",
                             Value::Dict({{Value::Str("properties"), Properties(o.dtype, o.shape)},
                                          {Value::Str("size"), size},
                                          {Value::Str("chunks"),
                                           Value::List({DataObject(kMetadataModule, "ChunkStorageMetadata",
                                                                   Value::Dict({{Value::Str("offsets"), empty},
                                                                                {Value::Str("sizes"), size}}))})}}))
                : DataObject(kMetadataModule, "BytesStorageMetadata", Value::Dict()));
        if (!o.path.empty()) object_paths.emplace_back(Value::Str(key), Value::Tuple(o.path));
        storage.emplace_back(ChunkIndex(key, o.scalar ? empty : Value::None(), o.scalar ? Value::Int(0) : Value::None()),
                             ChunkInfo(f.name, c));
        continue;
      }
      if (c.flat >= 0) {  // a key of its own, one chunk of it whole
        const LocalTensor& local = plan.flats[static_cast<size_t>(c.flat)].local;
        const Value zeros = TorchSize(std::vector<Index>(local.shape.size(), 0));
        flats.emplace_back(
            Value::Str(local.name),
            DataObject(kMetadataModule, "TensorStorageMetadata",
                       Value::Dict({{Value::Str("properties"), Properties(local.dtype, local.shape)},
                                    {Value::Str("size"), TorchSize(local.shape)},
                                    {Value::Str("chunks"),
                                     Value::List({DataObject(kMetadataModule, "ChunkStorageMetadata",
                                                             Value::Dict({{Value::Str("offsets"), zeros},
                                                                          {Value::Str("sizes"),
                                                                           TorchSize(local.shape)}}))})}})));
        storage.emplace_back(ChunkIndex(local.name, zeros, Value::Int(0)), ChunkInfo(f.name, c));
        continue;
      }
      const Tensor& t = plan.tensors[c.tensor];
      const size_t e = entry_of[c.tensor];
      const Box box = KeyBox(t, c.box);
      chunks[e].push_back(DataObject(
          kMetadataModule, "ChunkStorageMetadata",
          Value::Dict({{Value::Str("offsets"), TorchSize(box.begin)}, {Value::Str("sizes"), TorchSize(box.shape())}})));
      storage.emplace_back(ChunkIndex(t.key, TorchSize(box.begin), Value::Int(count[e]++)), ChunkInfo(f.name, c));
    }
  }
  pickle::Pairs tensors, planner;
  for (size_t e = 0; e < first.size(); ++e) {
    const Tensor& tensor = plan.tensors[first[e]];
    const Shape shape = KeyShape(tensor);
    tensors.emplace_back(Value::Str(tensor.key),
                         DataObject(kMetadataModule, "TensorStorageMetadata",
                                    Value::Dict({{Value::Str("properties"), Properties(tensor.dtype, shape)},
                                                 {Value::Str("size"), TorchSize(shape)},
                                                 {Value::Str("chunks"), Value::List(std::move(chunks[e]))}})));
    pickle::Items path;
    for (const std::string& p : tensor.path) path.push_back(Value::Str(p));
    planner.emplace_back(Value::Str(tensor.key), Value::Tuple(std::move(path)));
  }
  for (auto& entry : flats) tensors.push_back(std::move(entry));
  for (auto& entry : objects) tensors.push_back(std::move(entry));
  for (auto& entry : object_paths) planner.push_back(std::move(entry));
  // Megatron-Core's planner keeps no planner_data (its keys are flat).
  Value planner_data = plan.keys != Keys::kMegatronCore ? Value::Dict(std::move(planner)) : Value::None();
  Value metadata = DataObject(kMetadataModule, "Metadata",
                              Value::Dict({{Value::Str("state_dict_metadata"), Value::Dict(std::move(tensors))},
                                           {Value::Str("planner_data"), std::move(planner_data)},
                                           {Value::Str("storage_data"), Value::Dict(std::move(storage))},
                                           {Value::Str("storage_meta"), Value::None()},
                                           {Value::Str("version"), Value::Str("1.0.0")}}));
  return pickle::Pickle(metadata);
}

}  // namespace ptc::dcp
