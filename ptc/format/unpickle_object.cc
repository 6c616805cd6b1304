// The unpickler's opcodes that build objects: globals, checked against the
// allowlist (pickle.h, docs/torch_format.md); calls of them (REDUCE, NEWOBJ,
// NEWOBJ_EX), of which torch tensors and parameters, OrderedDicts and
// _codecs.encode are evaluated and the rest kept opaque; BUILD; and persistent
// ids, resolved to torch storages.
#include <algorithm>
#include <iterator>
#include <utility>

#include "ptc/format/unpickle_internal.h"

namespace ptc::pickle::internal {
namespace {

// Python 2 module names that protocol 0-2 pickles may use.
std::string FixModule(std::string module) {
  if (module == "__builtin__") return "builtins";
  if (module == "copy_reg") return "copyreg";
  return module;
}

bool IsTorchDTypeName(std::string_view n) {
  static constexpr std::string_view kNames[] = {"float64",
                                                "double",
                                                "float32",
                                                "float",
                                                "float16",
                                                "half",
                                                "bfloat16",
                                                "int64",
                                                "long",
                                                "int32",
                                                "int",
                                                "int16",
                                                "short",
                                                "int8",
                                                "uint8",
                                                "bool",
                                                "complex32",
                                                "chalf",
                                                "complex64",
                                                "cfloat",
                                                "complex128",
                                                "cdouble",
                                                "float8_e4m3fn",
                                                "float8_e5m2",
                                                "float8_e4m3fnuz",
                                                "float8_e5m2fnuz",
                                                "uint16",
                                                "uint32",
                                                "uint64",
                                                "qint8",
                                                "quint8",
                                                "qint32",
                                                "quint4x2"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

// The allowlist: what a checkpoint's pickle may name (pickle.h).
bool IsAllowedGlobal(const std::string& module, const std::string& name) {
  if (module == "megatron" || module.rfind("megatron.", 0) == 0) return !name.empty();
  const std::string full = module + "." + name;
  static constexpr std::string_view kAllowed[] = {
      "collections.OrderedDict",
      "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_parameter",
      "torch.Size",
      "argparse.Namespace",
      "_io.BytesIO",  // Transformer Engine's `*._extra_state` (a buffer of bytes, kept opaque)
      "_codecs.encode",
      "builtins.set",
      "builtins.frozenset",
      "builtins.slice",
      "builtins.bytes",
      "builtins.object",
      "builtins.getattr",  // only getattr(<megatron or DCP class>, name): enums pickled by Python 3.11
      "copyreg._reconstructor",
      "numpy.core.multiarray._reconstruct",
      "numpy._core.multiarray._reconstruct",
      "numpy.core.multiarray.scalar",
      "numpy._core.multiarray.scalar",
      "numpy.core.numeric._frombuffer",
      "numpy._core.numeric._frombuffer",
      "numpy.ndarray",
      "numpy.dtype",
      // PyTorch DCP's .metadata (ptc/checkpoint/dcp/read.h), kept opaque
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
      // Megatron-Core keeps every rank's SavePlan in its .metadata (all_local_plans)
      "torch.distributed.checkpoint.planner.SavePlan",
      "torch.distributed.checkpoint.planner.WriteItem",
      "torch.distributed.checkpoint.planner.WriteItemType",
      "torch.distributed.checkpoint.planner.TensorWriteData",
      "torch.serialization._get_layout",
      "pathlib.PosixPath",
  };
  if (std::find(std::begin(kAllowed), std::end(kAllowed), full) != std::end(kAllowed)) return true;
  if (module == "torch") return IsTorchDTypeName(name) || DTypeFromStorageClass(name).ok();
  return false;
}

}  // namespace

Handled Unpickler::StepObject() {
  switch (op_) {
    case kGlobal: {
      PTC_ASSIGN_OR_RETURN(std::string_view module, Line());
      PTC_ASSIGN_OR_RETURN(std::string_view name, Line());
      return PushGlobal(std::string(module), std::string(name));
    }
    case kStackGlobal: {
      PTC_ASSIGN_OR_RETURN(Node * name, Pop());
      PTC_ASSIGN_OR_RETURN(Node * module, Pop());
      if (name->kind != NK::kStr || module->kind != NK::kStr) return Err("module and name are not strings");
      return PushGlobal(module->s, name->s);
    }
    case kReduce:
      return Reduce();
    case kNewObj:
    case kNewObjEx:
      return NewObj();
    case kBuild:
      return Build();
    case kBinPersId: {
      PTC_ASSIGN_OR_RETURN(Node * pid, Pop());
      PTC_ASSIGN_OR_RETURN(Node * storage, PersistentLoad(pid));
      Push(storage);
      return Status::OK();
    }
    case kPersId: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      return Err("persistent id " + QuotedExcerpt(line) + " is not a torch storage");
    }
    default:
      return std::nullopt;
  }
}

// Whether `text` is a dotted Python name ("a.b_1.C"): what a module and a
// (qualified) class name are. Anything else (a newline, a space, "") names
// nothing Python could import, and would not survive being written back as
// GLOBAL's "module\nname\n".
bool IsDottedName(std::string_view text) {
  bool start = true;
  for (const char c : text) {
    if (c == '.') {
      if (start) return false;
      start = true;
      continue;
    }
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!letter && (start || c < '0' || c > '9')) return false;
    start = false;
  }
  return !start;
}

Status Unpickler::PushGlobal(std::string module, std::string name) {
  module = FixModule(std::move(module));
  if (!IsDottedName(module) || !IsDottedName(name))
    return InvalidArgumentError("global " + Abbreviate(Printable(module + "." + name)) + " in " + what_ + " at byte " +
                                std::to_string(op_pos_) + ": not a Python module and class name");
  if (!IsAllowedGlobal(module, name))
    return InvalidArgumentError("unknown global '" + module + "." + name + "' in " + what_ + " at byte " +
                                std::to_string(op_pos_) + "; ptcfs loads only checkpoint contents");
  Node* g = New(NK::kGlobal);
  g->global = Global{std::move(module), std::move(name)};
  Push(g);
  return Status::OK();
}

Status Unpickler::Reduce() {
  PTC_ASSIGN_OR_RETURN(Node * args, Pop());
  PTC_ASSIGN_OR_RETURN(Node * callable, Pop());
  if (args->kind != NK::kTuple) return Err("arguments are a " + NodeKindName(args) + ", not a tuple");
  if (callable->kind != NK::kGlobal) return Err("cannot call a " + NodeKindName(callable));
  PTC_ASSIGN_OR_RETURN(Node * result, Call(callable->global, args));
  Push(result);
  return Status::OK();
}

Status Unpickler::NewObj() {
  Node* kwargs = nullptr;
  if (op_ == kNewObjEx) {
    PTC_ASSIGN_OR_RETURN(kwargs, Pop());
    if (kwargs->kind != NK::kDict) return Err("keyword arguments are not a dict");
  }
  PTC_ASSIGN_OR_RETURN(Node * args, Pop());
  PTC_ASSIGN_OR_RETURN(Node * cls, Pop());
  if (args->kind != NK::kTuple) return Err("arguments are not a tuple");
  if (cls->kind != NK::kGlobal) return Err("the class is a " + NodeKindName(cls) + ", not a global");
  Node* obj = New(NK::kObject);
  obj->global = cls->global;
  obj->build = op_ == kNewObj ? Object::Build::kNewObj : Object::Build::kNewObjEx;
  obj->args = args;
  obj->kwargs = kwargs;
  Push(obj);
  return Status::OK();
}

// The result of g(*args) for REDUCE: evaluated for the callables the reader
// understands, else an opaque Object that Pickle re-emits.
Result<Node*> Unpickler::Call(const Global& g, Node* args) {
  const std::string full = g.FullName();
  const std::vector<Node*>& a = args->items;
  if (full == "collections.OrderedDict") {
    Node* d = New(NK::kOrderedDict);
    if (a.empty()) return d;
    if (a.size() == 1 && (a[0]->kind == NK::kList || a[0]->kind == NK::kTuple)) {
      for (Node* kv : a[0]->items) {
        if (kv->kind != NK::kTuple || kv->items.size() != 2) return Err("OrderedDict item is not a (key, value) pair");
        d->pairs.emplace_back(kv->items[0], kv->items[1]);
      }
      return d;
    }
    return Err("OrderedDict arguments are not () or ([(key, value), ...],)");
  }
  if (full == "torch._utils._rebuild_tensor_v2") return RebuildTensor(a);
  if (full == "torch._utils._rebuild_parameter") return RebuildParameter(a);
  if (full == "_codecs.encode") {
    if (a.size() != 2 || a[0]->kind != NK::kStr || a[1]->kind != NK::kStr)
      return Err("_codecs.encode arguments are not (text, encoding)");
    if (a[1]->s != "latin1" && a[1]->s != "latin-1")
      return Err("_codecs.encode with encoding '" + a[1]->s + "' (only latin1 is read)");
    std::string bytes;
    if (!Utf8ToLatin1(a[0]->s, &bytes)) return Err("_codecs.encode text is not latin-1");
    return NewStr(NK::kBytes, std::move(bytes));
  }
  if (full == "builtins.bytes" && a.empty()) return NewStr(NK::kBytes, "");
  if (full == "builtins.getattr" &&
      (a.size() != 2 || a[0]->kind != NK::kGlobal || a[1]->kind != NK::kStr ||
       (a[0]->global.module != "megatron" && a[0]->global.module.rfind("megatron.", 0) != 0 &&
        a[0]->global.FullName() != "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING" &&
        a[0]->global.FullName() != "torch.distributed.checkpoint.planner.WriteItemType")))
    return Err("builtins.getattr is read only as getattr(<class under megatron.>, name) or of DCP's enums");
  Node* obj = New(NK::kObject);
  obj->global = g;
  obj->args = args;
  return obj;
}

Result<std::vector<int64_t>> Unpickler::IntTuple(Node* n, const char* what) {
  if (n->kind != NK::kTuple) return Err(std::string(what) + " is a " + NodeKindName(n) + ", not a tuple of ints");
  std::vector<int64_t> out;
  for (Node* d : n->items) {
    if (d->kind != NK::kInt) return Err(std::string(what) + " holds a " + NodeKindName(d) + ", not an int");
    if (d->i < 0) return Err(std::string(what) + " holds the negative value " + std::to_string(d->i));
    out.push_back(d->i);
  }
  return out;
}

Result<Node*> Unpickler::RebuildTensor(const std::vector<Node*>& a) {
  if (a.size() != 6 && a.size() != 7)
    return Err("_rebuild_tensor_v2 takes 6 or 7 arguments, got " + std::to_string(a.size()));
  if (a[0]->kind != NK::kStorage)
    return Err("_rebuild_tensor_v2 argument 1 is a " + NodeKindName(a[0]) + ", not a storage");
  if (a[1]->kind != NK::kInt || a[1]->i < 0) return Err("_rebuild_tensor_v2 storage offset is not an int >= 0");
  PTC_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntTuple(a[2], "_rebuild_tensor_v2 size"));
  PTC_ASSIGN_OR_RETURN(std::vector<int64_t> stride, IntTuple(a[3], "_rebuild_tensor_v2 stride"));
  if (shape.size() != stride.size())
    return Err("_rebuild_tensor_v2 size has " + std::to_string(shape.size()) + " dimensions, stride " +
               std::to_string(stride.size()));
  if (a[4]->kind != NK::kBool) return Err("_rebuild_tensor_v2 requires_grad is not a bool");
  if ((a[5]->kind != NK::kDict && a[5]->kind != NK::kOrderedDict) || !a[5]->pairs.empty())
    return Err("_rebuild_tensor_v2 backward_hooks is not an empty OrderedDict");
  const StorageRef& s = storages_[static_cast<size_t>(a[0]->i)];
  Tensor t;
  t.storage_key = s.key;
  t.dtype = s.dtype;
  t.storage_numel = s.numel;
  t.location = s.location;
  t.storage_offset = a[1]->i;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  t.requires_grad = a[4]->i != 0;
  Node* n = NewInt(NK::kTensor, static_cast<int64_t>(tensors_.size()));
  tensors_.push_back(std::move(t));
  if (a.size() == 7) n->metadata = a[6];
  return n;
}

Result<Node*> Unpickler::RebuildParameter(const std::vector<Node*>& a) {
  if (a.size() != 3) return Err("_rebuild_parameter takes 3 arguments, got " + std::to_string(a.size()));
  if (a[0]->kind != NK::kTensor)
    return Err("_rebuild_parameter argument 1 is a " + NodeKindName(a[0]) + ", not a tensor");
  if (a[1]->kind != NK::kBool) return Err("_rebuild_parameter requires_grad is not a bool");
  if ((a[2]->kind != NK::kDict && a[2]->kind != NK::kOrderedDict) || !a[2]->pairs.empty())
    return Err("_rebuild_parameter backward_hooks is not an empty OrderedDict");
  Tensor t = tensors_[static_cast<size_t>(a[0]->i)];
  t.parameter = true;
  t.requires_grad = a[1]->i != 0;
  Node* n = NewInt(NK::kTensor, static_cast<int64_t>(tensors_.size()));
  n->metadata = a[0]->metadata;
  tensors_.push_back(std::move(t));
  return n;
}

// BINPERSID: ('storage', torch.<T>Storage, key, location, numel) becomes a
// kStorage node, which only _rebuild_tensor_v2 may take.
Result<Node*> Unpickler::PersistentLoad(Node* pid) {
  const auto& p = pid->items;
  if (pid->kind != NK::kTuple || p.size() != 5 || (p[0]->kind != NK::kStr && p[0]->kind != NK::kBytes) ||
      p[0]->s != "storage")
    return Err("persistent id is not a torch storage ('storage', type, key, location, numel)");
  if (p[1]->kind != NK::kGlobal || p[1]->global.module != "torch")
    return Err("persistent id storage type is a " + NodeKindName(p[1]) + ", not a torch storage class");
  auto dtype = DTypeFromStorageClass(p[1]->global.name);
  if (!dtype.ok()) return Err("unsupported storage type torch." + p[1]->global.name);
  if (p[2]->kind != NK::kStr || p[2]->s.empty()) return Err("persistent id storage key is not a string");
  if (p[3]->kind != NK::kStr) return Err("persistent id storage location is not a string");
  if (p[4]->kind != NK::kInt || p[4]->i < 0) return Err("persistent id storage size is not an int >= 0");
  Node* n = NewInt(NK::kStorage, static_cast<int64_t>(storages_.size()));
  storages_.push_back(StorageRef{p[2]->s, *dtype, p[3]->s, static_cast<uint64_t>(p[4]->i)});
  return n;
}

// BUILD: the state of an OrderedDict (a dict, its __dict__) or of an object;
// at most once per target.
Status Unpickler::Build() {
  PTC_ASSIGN_OR_RETURN(Node * state, Pop());
  PTC_ASSIGN_OR_RETURN(Node * target, Top());
  if (target->kind == NK::kOrderedDict) {
    if (state->kind != NK::kDict) return Err("OrderedDict state is a " + NodeKindName(state) + ", not a dict");
  } else if (target->kind != NK::kObject) {
    return Err("cannot BUILD a " + NodeKindName(target));
  }
  if (target->state) return Err("second BUILD of a " + NodeKindName(target));
  target->state = state;
  return Status::OK();
}

}  // namespace ptc::pickle::internal
