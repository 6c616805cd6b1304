// The unpickler's second phase: the graph the machine built, copied into a
// Value tree, bounded in depth and size; a node met again on its own path is a
// structure that contains itself, which a tree cannot hold.
#include <string>
#include <unordered_map>

#include "ptc/format/unpickle_internal.h"

namespace ptc::pickle::internal {

Result<Items> Unpickler::ConvertAll(const std::vector<Node*>& nodes, int depth) {
  Items out;
  out.reserve(nodes.size());
  for (Node* n : nodes) {
    PTC_ASSIGN_OR_RETURN(Value v, Convert(n, depth));
    out.push_back(std::move(v));
  }
  return out;
}

namespace {

// The text two dict keys share exactly when Python takes them for one key:
// True and 1 alike (bool is an int), a DCP MetadataIndex by its fqn and offset
// (its `index` is a hint, left out of the dataclass's __eq__ and __hash__),
// anything else by its whole canonical form. Floats equal to an int, and keys
// whose classes define their own equality, are rarer than this needs.
std::string DictKeyText(const Value& key) {
  switch (key.kind()) {
    case Kind::kStr:
      return "s" + key.as_str();
    case Kind::kInt:
      return "i" + std::to_string(key.as_int());
    case Kind::kBool:
      return key.as_bool() ? "i1" : "i0";
    default:
      break;
  }
  if (key.kind() == Kind::kObject &&
      key.object().callable.FullName() == "torch.distributed.checkpoint.metadata.MetadataIndex") {
    const Value* fqn = key.GetAttr("fqn");
    const Value* offset = key.GetAttr("offset");
    if (fqn != nullptr && offset != nullptr) return "m" + fqn->DebugString() + "@" + offset->DebugString();
  }
  return "v" + key.DebugString();
}

}  // namespace

// A dict's items as Python's dict holds them after the pickle's SETITEMs: a
// key set again keeps its first place and takes the last value, so that
// torch.load, dcp.load and ptcfs read one and the same dict.
Result<Pairs> Unpickler::ConvertPairs(const std::vector<std::pair<Node*, Node*>>& pairs, int depth, bool dict) {
  Pairs out;
  out.reserve(pairs.size());
  std::unordered_map<std::string, size_t> place;
  for (const auto& [k, v] : pairs) {
    PTC_ASSIGN_OR_RETURN(Value key, Convert(k, depth));
    PTC_ASSIGN_OR_RETURN(Value value, Convert(v, depth));
    if (dict) {
      const auto [at, fresh] = place.try_emplace(DictKeyText(key), out.size());
      if (!fresh) {
        out[at->second].second = std::move(value);
        continue;
      }
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

Result<Value> Unpickler::Convert(Node* n, int depth) {
  if (depth > limits_.max_depth)
    return InvalidArgumentError(what_ + ": pickled value nests deeper than " + std::to_string(limits_.max_depth) +
                                " levels");
  if (++values_ > limits_.max_values)
    return InvalidArgumentError(what_ + ": pickled value has more than " + std::to_string(limits_.max_values) +
                                " nodes (shared references counted each time)");
  if (n->on_path) return InvalidArgumentError(what_ + ": pickled " + NodeKindName(n) + " contains itself");
  struct Guard {
    Node* n;
    ~Guard() { n->on_path = false; }
  } guard{n};
  n->on_path = true;
  ++depth;
  switch (n->kind) {
    case NK::kNone:
      return Value::None();
    case NK::kBool:
      return Value::Bool(n->i != 0);
    case NK::kInt:
      return Value::Int(n->i);
    case NK::kFloat:
      return Value::Float(n->f);
    case NK::kStr:
      return Value::Str(n->s);
    case NK::kBytes:
      return Value::Bytes(n->s);
    case NK::kList:
    case NK::kTuple: {
      PTC_ASSIGN_OR_RETURN(Items items, ConvertAll(n->items, depth));
      return n->kind == NK::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case NK::kDict:
    case NK::kOrderedDict: {
      PTC_ASSIGN_OR_RETURN(Pairs pairs, ConvertPairs(n->pairs, depth, /*dict=*/true));
      Value d = n->kind == NK::kDict ? Value::Dict(std::move(pairs)) : Value::OrderedDict(std::move(pairs));
      if (n->state) {
        PTC_ASSIGN_OR_RETURN(Value state, Convert(n->state, depth));
        d.set_dict_state(std::move(state));
      }
      return d;
    }
    case NK::kTensor: {
      Tensor t = tensors_[static_cast<size_t>(n->i)];
      if (n->metadata) {
        PTC_ASSIGN_OR_RETURN(Value m, Convert(n->metadata, depth));
        t.metadata = Boxed<Value>(std::move(m));
      }
      return Value::FromTensor(std::move(t));
    }
    case NK::kGlobal:
      return Value::FromGlobal(n->global);
    case NK::kObject: {
      Object o;
      o.callable = n->global;
      o.build = n->build;
      PTC_ASSIGN_OR_RETURN(o.args, ConvertAll(n->args->items, depth));
      if (n->kwargs) {
        PTC_ASSIGN_OR_RETURN(Value kw, Convert(n->kwargs, depth));
        o.kwargs = Boxed<Value>(std::move(kw));
      }
      PTC_ASSIGN_OR_RETURN(o.list_items, ConvertAll(n->items, depth));
      PTC_ASSIGN_OR_RETURN(o.dict_items, ConvertPairs(n->pairs, depth, /*dict=*/false));
      if (n->state) {
        PTC_ASSIGN_OR_RETURN(Value st, Convert(n->state, depth));
        o.state = Boxed<Value>(std::move(st));
      }
      return Value::FromObject(std::move(o));
    }
    case NK::kStorage:
      return InvalidArgumentError(what_ + ": a torch storage outside _rebuild_tensor_v2 (not supported)");
  }
  return InternalError("unreachable");
}

}  // namespace ptc::pickle::internal
