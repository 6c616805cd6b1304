#include "ptc/checkpoint/dcp.h"

#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "ptc/format/pickle.h"
#include "ptc/model/view.h"

namespace ptc::dcp {
namespace {

using pickle::Value;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

std::string_view TorchDTypeName(DType t) {
  switch (t) {
    case DType::kF64:
      return "float64";
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI64:
      return "int64";
    case DType::kI32:
      return "int32";
    case DType::kI16:
      return "int16";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kBool:
      return "bool";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kF8E5M2:
      return "float8_e5m2";
  }
  return "uint8";
}

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

std::string DistcpName(int worker) { return "__" + std::to_string(worker) + "_0.distcp"; }

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

// TensorProperties pickles its __getstate__ tuple: dtype, layout, requires_grad,
// memory format (an enum member), pin_memory, strides.
Value Properties(const Tensor& t) {
  pickle::Items state;
  state.push_back(Value::FromGlobal({"torch", std::string(TorchDTypeName(t.dtype))}));
  state.push_back(Call("torch.serialization", "_get_layout", {Value::Str("torch.strided")}));
  state.push_back(Value::Bool(false));
  state.push_back(
      Call("builtins", "getattr",
           {Value::FromGlobal({kMetadataModule, "_MEM_FORMAT_ENCODING"}), Value::Str("TORCH_CONTIGUOUS_FORMAT")}));
  state.push_back(Value::Bool(false));
  state.push_back(Ints(RowMajorStrides(t.shape)));
  return DataObject(kMetadataModule, "TensorProperties", Value::Tuple(std::move(state)));
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

Result<Plan> PlanCheckpoint(const GenerationManifest& m) {
  Plan plan;
  std::set<std::string> names;
  for (const TensorRecord& t : m.tensors) names.insert(t.name);
  std::set<std::string> keys;
  std::map<std::string, size_t> index;
  for (const TensorRecord& t : m.tensors) {
    Tensor d{t.name, "", {}, t.dtype, t.shape};
    if (auto state = OptimizerStateOf(t.name, names)) {
      d.path = {"optim", "state", state->first, state->second};
    } else {
      d.path = {"model", t.name};
    }
    for (const std::string& part : d.path) d.key += (d.key.empty() ? "" : ".") + part;
    if (!keys.insert(d.key).second) return InvalidArgumentError("tensor " + t.name + ": DCP key " + d.key + " repeats");
    index[t.name] = plan.tensors.size();
    plan.tensors.push_back(std::move(d));
  }
  // The stored boxes of each tensor, in manifest order, with their workers.
  std::vector<std::vector<Box>> boxes(plan.tensors.size());
  std::vector<std::vector<int>> workers(plan.tensors.size());
  for (const ShardRecord& s : m.shards) {
    auto it = index.find(s.tensor);
    if (it == index.end()) return InvalidArgumentError("a stored piece of " + s.tensor + ", which is not a tensor");
    for (const Box& b : s.boxes) {
      boxes[it->second].push_back(b);
      workers[it->second].push_back(s.worker);
    }
  }
  std::map<int, File> files;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const Tensor& tensor = plan.tensors[t];
    const Box full = Box::Full(tensor.shape);
    Index covered = 0;
    for (auto& [box, source] : DisjointBoxes(boxes[t])) {
      if (!Contains(full, box)) {
        return InvalidArgumentError("tensor " + tensor.name + ": stored box " + box.ToString() + " lies outside " +
                                    ShapeToString(tensor.shape));
      }
      covered += box.volume();
      PTC_ASSIGN_OR_RETURN(TorchFilePlan chunk_file, ChunkFile(tensor.dtype, box), "tensor " + tensor.name);
      PTC_ASSIGN_OR_RETURN(ZipLayout layout, LayoutTorchFile(chunk_file), "tensor " + tensor.name);
      const int worker = workers[t][source];
      File& f = files[worker];
      if (f.name.empty()) f.name = DistcpName(worker);
      f.chunks.push_back(Chunk{t, std::move(box), f.size, layout.size});
      f.size += layout.size;
    }
    if (covered != full.volume()) {
      return InvalidArgumentError("tensor " + tensor.name + ": the stored pieces hold " + std::to_string(covered) +
                                  " of its " + std::to_string(full.volume()) + " elements");
    }
  }
  for (auto& [worker, f] : files) plan.files.push_back(std::move(f));
  return plan;
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

std::string EncodeMetadata(const Plan& plan) {
  std::vector<pickle::Items> chunks(plan.tensors.size());
  pickle::Pairs storage;
  std::vector<int64_t> count(plan.tensors.size(), 0);
  for (const File& f : plan.files) {
    for (const Chunk& c : f.chunks) {
      chunks[c.tensor].push_back(DataObject(kMetadataModule, "ChunkStorageMetadata",
                                            Value::Dict({{Value::Str("offsets"), TorchSize(c.box.begin)},
                                                         {Value::Str("sizes"), TorchSize(c.box.shape())}})));
      Value index = DataObject(kMetadataModule, "MetadataIndex",
                               Value::Dict({{Value::Str("fqn"), Value::Str(plan.tensors[c.tensor].key)},
                                            {Value::Str("offset"), TorchSize(c.box.begin)},
                                            {Value::Str("index"), Value::Int(count[c.tensor]++)}}));
      Value info = DataObject("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                              Value::Dict({{Value::Str("relative_path"), Value::Str(f.name)},
                                           {Value::Str("offset"), Value::Int(static_cast<int64_t>(c.offset))},
                                           {Value::Str("length"), Value::Int(static_cast<int64_t>(c.size))}}));
      storage.emplace_back(std::move(index), std::move(info));
    }
  }
  pickle::Pairs tensors, planner;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const Tensor& tensor = plan.tensors[t];
    tensors.emplace_back(Value::Str(tensor.key),
                         DataObject(kMetadataModule, "TensorStorageMetadata",
                                    Value::Dict({{Value::Str("properties"), Properties(tensor)},
                                                 {Value::Str("size"), TorchSize(tensor.shape)},
                                                 {Value::Str("chunks"), Value::List(std::move(chunks[t]))}})));
    pickle::Items path;
    for (const std::string& p : tensor.path) path.push_back(Value::Str(p));
    planner.emplace_back(Value::Str(tensor.key), Value::Tuple(std::move(path)));
  }
  Value metadata = DataObject(kMetadataModule, "Metadata",
                              Value::Dict({{Value::Str("state_dict_metadata"), Value::Dict(std::move(tensors))},
                                           {Value::Str("planner_data"), Value::Dict(std::move(planner))},
                                           {Value::Str("storage_data"), Value::Dict(std::move(storage))},
                                           {Value::Str("storage_meta"), Value::None()},
                                           {Value::Str("version"), Value::Str("1.0.0")}}));
  return pickle::Pickle(metadata);
}

}  // namespace ptc::dcp
