// Internal to the unpickler: the stack machine and the graph it builds, shared
// by the files that implement it. Not part of the public interface
// (ptc/format/pickle.h declares Unpickle).
//
// Unpickling runs in two phases. The stack machine builds a graph of Nodes in
// an arena with Python's reference semantics (the memo holds references, so
// an OrderedDict memoized before its SETITEMS is complete when fetched back).
// The graph is then copied into a Value tree, bounded in depth and size, which
// also rejects a structure that contains itself.
//
//   unpickle.cc            the machine: the loop and its dispatch, reading the
//                          input, the stack, the memo, PROTO/FRAME/STOP;
//                          the entry point Unpickle
//   unpickle_literal.cc    opcodes that push a constant: None, bools, ints,
//                          floats, str and bytes
//   unpickle_container.cc  opcodes that build tuples, lists, dicts and sets
//   unpickle_object.cc     opcodes that build objects: globals (the
//                          allowlist), REDUCE, NEWOBJ, BUILD, persistent ids
//   unpickle_convert.cc    the second phase: the graph into a Value tree
//
// An opcode's errors come from Err, which names the input, the opcode and its
// byte offset; an unknown global, a missing STOP and the second phase have
// messages of their own. Tests assert these messages byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/format/pickle.h"
#include "ptc/format/pickle_internal.h"

namespace ptc::pickle::internal {

// The kinds of graph nodes: those of Kind, in the same order, then kStorage.
enum class NK : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kList,
  kTuple,
  kDict,
  kOrderedDict,
  kTensor,
  kGlobal,
  kObject,
  kStorage,  // a persistent id resolved to a torch storage; only an argument of _rebuild_tensor_v2
};

// A storage named by a persistent id: ('storage', torch.<T>Storage, key, location, numel).
struct StorageRef {
  std::string key;
  DType dtype;
  std::string location;
  uint64_t numel;
};

// A Python object as the machine sees it: mutable until the pickle ends,
// referenced from the stack, the memo and other nodes.
struct Node {
  explicit Node(NK k) : kind(k) {}
  NK kind;
  bool on_path = false;  // conversion: cycle detection
  Object::Build build = Object::Build::kReduce;
  int64_t i = 0;  // kBool, kInt; index into tensors / storages for kTensor / kStorage
  double f = 0;
  std::string s;                               // kStr, kBytes
  Global global;                               // kGlobal; kObject: the callable
  std::vector<Node*> items;                    // kList, kTuple; kObject: list items
  std::vector<std::pair<Node*, Node*>> pairs;  // dicts; kObject: dict items
  Node* state = nullptr;                       // kOrderedDict, kObject: BUILD state
  Node* args = nullptr;                        // kObject: a tuple
  Node* kwargs = nullptr;                      // kObject, kNewObjEx
  Node* metadata = nullptr;                    // kTensor
};

// The first 40 bytes of an opcode argument, in single quotes, for messages.
std::string QuotedExcerpt(std::string_view s);

// The outcome of one opcode family's step: nullopt when the opcode is not of
// that family, else the Status of executing it.
using Handled = std::optional<Status>;

// One unpickling. Not reusable; `what` must outlive it.
class Unpickler {
 public:
  Unpickler(std::string_view data, const std::string& what, const UnpickleLimits& limits)
      : data_(data), what_(what), limits_(limits) {}

  // Runs the machine to STOP, then converts the top of the stack.
  // \error as pickle::Unpickle.
  Result<Value> Run();

 private:
  // ---- the machine (unpickle.cc)
  // Executes op_, the opcode at op_pos_, whose arguments start at pos_: asks
  // each family in turn, and rejects an opcode no family takes. Sets *done at STOP.
  Status Step(bool* done);
  Handled StepMachine(bool* done);               // PROTO, FRAME, STOP, MARK, POP, DUP, the memo
  Status Err(const std::string& message) const;  // InvalidArgument naming what_, op_, op_pos_

  // The arena. Every node lives until the Unpickler is destroyed.
  Node* New(NK kind);
  Node* NewStr(NK kind, std::string s);
  Node* NewInt(NK kind, int64_t i);
  Status CheckArena() const;  // after each opcode, which creates at most three nodes

  // Opcode arguments, consumed from pos_.
  Result<std::string_view> Take(uint64_t n);
  Result<uint64_t> TakeUInt(int bytes);              // little-endian
  Result<std::string_view> Line();                   // up to '\n', which is consumed
  Result<int64_t> ParseDecimal(std::string_view s);  // protocol-0 INT/LONG/PUT/GET text

  // The stack; Pop and Top see only what is above the innermost MARK.
  size_t Available() const;
  Result<Node*> Pop();
  Result<Node*> Top();
  Result<std::vector<Node*>> PopMark();  // what is above the innermost MARK, and the MARK
  void Push(Node* n);

  // The memo: PUT stores the top of the stack, GET pushes it again.
  Status Put(uint64_t index);
  Status Get(uint64_t index);

  // "list", "torch storage", "collections.OrderedDict object", ... for messages.
  static std::string NodeKindName(const Node* n);

  // ---- constants (unpickle_literal.cc)
  Handled StepLiteral();
  Result<int64_t> DecodeLong(std::string_view bytes);  // LONG1/LONG4 two's complement
  Result<Node*> Text(NK kind, std::string_view bytes);
  Status PushText(NK kind, int len_bytes);  // a length of len_bytes bytes, then the text

  // ---- containers (unpickle_container.cc)
  Handled StepContainer();
  Node* NewTuple(std::vector<Node*> items);
  Status TupleN(size_t n);
  Status Append(Node* target, std::vector<Node*> items);
  Status SetItems(Node* target, const std::vector<Node*>& kv);

  // ---- objects (unpickle_object.cc)
  Handled StepObject();
  Status PushGlobal(std::string module, std::string name);  // checks the allowlist
  Status Reduce();
  Status NewObj();  // NEWOBJ and NEWOBJ_EX
  Status Build();
  Result<Node*> Call(const Global& g, Node* args);
  Result<Node*> RebuildTensor(const std::vector<Node*>& a);
  Result<Node*> RebuildParameter(const std::vector<Node*>& a);
  Result<Node*> PersistentLoad(Node* pid);
  Result<std::vector<int64_t>> IntTuple(Node* n, const char* what);

  // ---- the second phase (unpickle_convert.cc)
  Result<Value> Convert(Node* n, int depth);
  Result<Items> ConvertAll(const std::vector<Node*>& nodes, int depth);
  // `dict`: the items of a dict (a key set again replaces its value in place),
  // else an object's __setitem__ calls (kept as made).
  Result<Pairs> ConvertPairs(const std::vector<std::pair<Node*, Node*>>& pairs, int depth, bool dict);

  std::string_view data_;
  const std::string& what_;
  UnpickleLimits limits_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<std::unique_ptr<Node>> arena_;
  std::vector<Tensor> tensors_;
  std::vector<StorageRef> storages_;
  std::vector<Node*> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::unordered_map<uint64_t, Node*> memo_;
  uint64_t values_ = 0;  // converted so far
};

}  // namespace ptc::pickle::internal
