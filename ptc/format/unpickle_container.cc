// The unpickler's opcodes that build containers: tuples, lists, dicts and
// sets, empty or from the items above a MARK, and the ones that add items to
// the container on top of the stack (APPEND(S), SETITEM(S), ADDITEMS).
#include <utility>

#include "ptc/format/unpickle_internal.h"

namespace ptc::pickle::internal {

Handled Unpickler::StepContainer() {
  switch (op_) {
    case kEmptyTuple:
      Push(NewTuple({}));
      return Status::OK();
    case kTuple: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark());
      Push(NewTuple(std::move(items)));
      return Status::OK();
    }
    case kTuple1:
      return TupleN(1);
    case kTuple2:
      return TupleN(2);
    case kTuple3:
      return TupleN(3);
    case kEmptyList:
      Push(New(NK::kList));
      return Status::OK();
    case kList: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark());
      Node* l = New(NK::kList);
      l->items = std::move(items);
      Push(l);
      return Status::OK();
    }
    case kAppend: {
      PTC_ASSIGN_OR_RETURN(Node * item, Pop());
      PTC_ASSIGN_OR_RETURN(Node * target, Top());
      return Append(target, {item});
    }
    case kAppends: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark());
      PTC_ASSIGN_OR_RETURN(Node * target, Top());
      return Append(target, std::move(items));
    }
    case kEmptyDict:
      Push(New(NK::kDict));
      return Status::OK();
    case kDict: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> kv, PopMark());
      Node* d = New(NK::kDict);
      Push(d);
      return SetItems(d, kv);
    }
    case kSetItem: {
      PTC_ASSIGN_OR_RETURN(Node * v, Pop());
      PTC_ASSIGN_OR_RETURN(Node * k, Pop());
      PTC_ASSIGN_OR_RETURN(Node * target, Top());
      return SetItems(target, {k, v});
    }
    case kSetItems: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> kv, PopMark());
      PTC_ASSIGN_OR_RETURN(Node * target, Top());
      return SetItems(target, kv);
    }
    case kEmptySet:
    case kFrozenSet: {
      std::vector<Node*> items;
      if (op_ == kFrozenSet) {
        PTC_ASSIGN_OR_RETURN(items, PopMark());
      }
      Node* list = New(NK::kList);
      list->items = std::move(items);
      Node* set = New(NK::kObject);
      set->global = Global{"builtins", op_ == kEmptySet ? "set" : "frozenset"};
      set->args = NewTuple({list});
      Push(set);
      return Status::OK();
    }
    case kAddItems: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark());
      PTC_ASSIGN_OR_RETURN(Node * set, Top());
      if (set->kind != NK::kObject || set->global.FullName() != "builtins.set" || set->args->items.size() != 1 ||
          set->args->items[0]->kind != NK::kList)
        return Err("cannot add items to a " + NodeKindName(set));
      auto& dst = set->args->items[0]->items;
      dst.insert(dst.end(), items.begin(), items.end());
      return Status::OK();
    }
    default:
      return std::nullopt;
  }
}

Node* Unpickler::NewTuple(std::vector<Node*> items) {
  Node* t = New(NK::kTuple);
  t->items = std::move(items);
  return t;
}

// TUPLE1, TUPLE2, TUPLE3: the top n items become a tuple.
Status Unpickler::TupleN(size_t n) {
  if (Available() < n) return Err("stack underflow");
  std::vector<Node*> items(stack_.end() - static_cast<ptrdiff_t>(n), stack_.end());
  stack_.resize(stack_.size() - n);
  Push(NewTuple(std::move(items)));
  return Status::OK();
}

// Lists, and objects (whose list items Python appends with extend / append).
Status Unpickler::Append(Node* target, std::vector<Node*> items) {
  if (target->kind != NK::kList && target->kind != NK::kObject)
    return Err("cannot append to a " + NodeKindName(target));
  target->items.insert(target->items.end(), items.begin(), items.end());
  return Status::OK();
}

// Dicts, and objects (whose dict items Python sets with __setitem__);
// `kv` alternates keys and values.
Status Unpickler::SetItems(Node* target, const std::vector<Node*>& kv) {
  if (kv.size() % 2 != 0) return Err("odd number of keys and values");
  if (target->kind != NK::kDict && target->kind != NK::kOrderedDict && target->kind != NK::kObject)
    return Err("cannot set items of a " + NodeKindName(target));
  for (size_t k = 0; k < kv.size(); k += 2) target->pairs.emplace_back(kv[k], kv[k + 1]);
  return Status::OK();
}

}  // namespace ptc::pickle::internal
