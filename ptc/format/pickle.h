// Python pickles as found in torch.save files: a restricted unpickler into a
// value tree and a protocol-2 pickler that writes the tree back.
//
// The unpickler never runs code: it knows the opcodes of protocols 0-5 that
// pickle.dumps and torch.save emit for checkpoint contents, and accepts only
// the globals of an allowlist (docs/torch_format.md): torch tensors and
// storages, dtypes, collections.OrderedDict, argparse.Namespace, io.BytesIO
// (Transformer Engine's extra state), numpy arrays
// (Megatron's rng state), sets, slices and enum-like classes under
// `megatron.`. Tensors become Tensor references (storage key, dtype, view);
// the data stays in the zip file. Calls of other allowed callables become
// opaque Objects that Pickle re-emits so that Python rebuilds the same object.
//
// Pickle writes protocol 2 with only the opcodes that
// torch.load(weights_only=True) understands, tensors exactly as torch writes
// them, and no memo (shared references come back as copies).
//
// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/dtype.h"

namespace ptc::pickle {

enum class Kind {
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
};
std::string_view KindName(Kind kind);  // "None", "bool", "int", ..., "OrderedDict", "Tensor", "global", "object"

class Value;

// An owning pointer that copies what it points to: value semantics for the
// recursive members of the tree. May be empty.
template <typename T>
class Boxed {
 public:
  Boxed() = default;
  explicit Boxed(T v) : p_(std::make_unique<T>(std::move(v))) {}
  Boxed(const Boxed& o) : p_(o.p_ ? std::make_unique<T>(*o.p_) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& o) {
    if (this != &o) p_ = o.p_ ? std::make_unique<T>(*o.p_) : nullptr;
    return *this;
  }
  Boxed& operator=(Boxed&&) noexcept = default;
  ~Boxed() = default;

  explicit operator bool() const { return p_ != nullptr; }
  const T* get() const { return p_.get(); }
  T* get() { return p_.get(); }
  const T& operator*() const { return *p_; }
  T& operator*() { return *p_; }
  const T* operator->() const { return p_.get(); }
  T* operator->() { return p_.get(); }
  void reset() { p_.reset(); }

  friend bool operator==(const Boxed& a, const Boxed& b) {
    return a.p_ == nullptr ? b.p_ == nullptr : b.p_ != nullptr && *a.p_ == *b.p_;
  }

 private:
  std::unique_ptr<T> p_;
};

using Items = std::vector<Value>;                    // list and tuple elements
using Pairs = std::vector<std::pair<Value, Value>>;  // dict items, in order

// A module-level name: `torch.float16`, `argparse.Namespace`.
struct Global {
  std::string module;
  std::string name;

  std::string FullName() const { return module + "." + name; }
  friend bool operator==(const Global&, const Global&) = default;
};

// A torch tensor: a strided view of a storage that the file holds as the zip
// member "<archive>/data/<storage_key>". Offsets and strides count elements.
struct Tensor {
  std::string storage_key;
  DType dtype = DType::kF32;   // of the storage (torch.FloatStorage: F32, ...)
  uint64_t storage_numel = 0;  // elements of the whole storage
  std::string location = "cpu";
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  bool requires_grad = false;
  bool parameter = false;  // a torch.nn.Parameter (_rebuild_parameter)
  Boxed<Value> metadata;   // the optional 7th _rebuild_tensor_v2 argument

  friend bool operator==(const Tensor& a, const Tensor& b);  // deep
};

// An object rebuilt by calling an allowed global, kept opaque.
//   kReduce:   callable(*args)                      (REDUCE)
//   kNewObj:   callable.__new__(callable, *args)    (NEWOBJ)
//   kNewObjEx: callable.__new__(callable, *args, **kwargs)  (NEWOBJ_EX)
// then list_items appended, dict_items set, and state applied (BUILD).
struct Object {
  enum class Build { kReduce, kNewObj, kNewObjEx };
  Global callable;
  Build build = Build::kReduce;
  Items args;
  Boxed<Value> kwargs;  // a dict, kNewObjEx only
  Items list_items;
  Pairs dict_items;
  Boxed<Value> state;  // the BUILD state; empty when there was no BUILD

  friend bool operator==(const Object& a, const Object& b);  // deep
};

// Dict and OrderedDict items, and for an OrderedDict the optional BUILD state
// (a state_dict's {'_metadata': ...}).
struct DictData {
  Pairs pairs;
  Boxed<Value> state;

  friend bool operator==(const DictData& a, const DictData& b);  // deep
};

// A node of the tree. Accessors REQUIRE the matching kind.
class Value {
 public:
  Value() = default;  // None
  static Value None() { return Value(); }
  static Value Bool(bool b) { return Value(Kind::kBool, b); }
  static Value Int(int64_t i) { return Value(Kind::kInt, i); }
  static Value Float(double f) { return Value(Kind::kFloat, f); }
  static Value Str(std::string s) { return Value(Kind::kStr, std::move(s)); }  // UTF-8
  static Value Bytes(std::string s) { return Value(Kind::kBytes, std::move(s)); }
  static Value List(Items items = {}) { return Value(Kind::kList, std::move(items)); }
  static Value Tuple(Items items = {}) { return Value(Kind::kTuple, std::move(items)); }
  static Value Dict(Pairs pairs = {}) { return Value(Kind::kDict, DictData{std::move(pairs), {}}); }
  static Value OrderedDict(Pairs pairs = {}) { return Value(Kind::kOrderedDict, DictData{std::move(pairs), {}}); }
  static Value FromTensor(Tensor t) { return Value(Kind::kTensor, Boxed<Tensor>(std::move(t))); }
  static Value FromGlobal(Global g) { return Value(Kind::kGlobal, Boxed<Global>(std::move(g))); }
  static Value FromObject(Object o) { return Value(Kind::kObject, Boxed<Object>(std::move(o))); }

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_dict() const { return kind_ == Kind::kDict || kind_ == Kind::kOrderedDict; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_str() const { return std::get<std::string>(data_); }  // Str and Bytes
  const Items& items() const { return std::get<Items>(data_); }               // List and Tuple
  Items& items() { return std::get<Items>(data_); }
  const Pairs& pairs() const { return std::get<DictData>(data_).pairs; }  // Dict and OrderedDict
  Pairs& pairs() { return std::get<DictData>(data_).pairs; }
  const Tensor& tensor() const { return *std::get<Boxed<Tensor>>(data_); }
  Tensor& tensor() { return *std::get<Boxed<Tensor>>(data_); }
  const Global& global() const { return *std::get<Boxed<Global>>(data_); }
  const Object& object() const { return *std::get<Boxed<Object>>(data_); }
  Object& object() { return *std::get<Boxed<Object>>(data_); }
  // The OrderedDict BUILD state, or nullptr. REQUIRES: is_dict().
  const Value* dict_state() const { return std::get<DictData>(data_).state.get(); }
  void set_dict_state(Value state) { std::get<DictData>(data_).state = Boxed<Value>(std::move(state)); }

  // Dict access by key. nullptr when this is not a dict or has no such key.
  const Value* Find(std::string_view key) const;  // a Str key
  Value* Find(std::string_view key);
  const Value* Find(const Value& key) const;  // any key (==)
  Value* Find(const Value& key);
  // Replaces the value of `key` or appends the item. REQUIRES: is_dict().
  void Set(Value key, Value value);
  void Set(std::string_view key, Value value) { Set(Str(std::string(key)), std::move(value)); }
  // Removes the item; false when there was none. REQUIRES: is_dict().
  bool Erase(std::string_view key);

  // Attributes of an Object whose BUILD state is a dict (argparse.Namespace):
  // nullptr when this is not such an object or lacks the attribute.
  const Value* GetAttr(std::string_view name) const;
  Value* GetAttr(std::string_view name);
  // Sets the attribute, creating an empty dict state if there is none.
  // \error InvalidArgument when this is not an Object or its state is not a dict.
  Status SetAttr(std::string_view name, Value value);

  // A Python-like rendering, for messages and tests: {'a': [1, 2.5, b'x']}.
  std::string DebugString() const;

  // Deep equality; floats compare by bit pattern (so NaN == NaN).
  friend bool operator==(const Value& a, const Value& b);

 private:
  template <typename T>
  Value(Kind kind, T data) : kind_(kind), data_(std::move(data)) {}

  Kind kind_ = Kind::kNone;
  // Tensor, Global and Object live on the heap to keep a Value small (40 bytes).
  std::variant<std::monostate, bool, int64_t, double, std::string, Items, DictData, Boxed<Tensor>, Boxed<Global>,
               Boxed<Object>>
      data_;
};

// Look-ups by key in the dicts of a tree that does not change while the index
// lives: a dict's str and int keys are indexed at its first look-up, so n
// look-ups cost O(n) where Value::Find scans the dict each time (a state_dict
// of 100,000 tensors). Answers as Value::Find, the first of repeated keys.
class DictIndex {
 public:
  // As dict.Find(key); nullptr when `dict` is not a dict or lacks the key.
  const Value* Find(const Value& dict, const Value& key);
  const Value* Find(const Value& dict, std::string_view key);  // a Str key

 private:
  // Per indexed dict: "s<text>" for a Str key, "i<decimal>" for an Int key.
  std::unordered_map<const Value*, std::unordered_map<std::string, const Value*>> by_dict_;
};

// Calls fn(path, tensor) for each tensor under `root`, in tree order,
// descending into dicts, lists, tuples and objects (arguments, items, state).
// `path` joins dict keys (str keys as they are, others by DebugString) and
// sequence indices with '.': "model.language_model.encoder.layers.0.weight".
void ForEachTensor(const Value& root, const std::function<void(const std::string& path, const Tensor&)>& fn);
void ForEachTensor(Value& root, const std::function<void(const std::string& path, Tensor&)>& fn);

// The torch storage class of a dtype ("FloatStorage") and back.
std::string_view StorageClassName(DType dtype);
// torch's name of a dtype ("bfloat16", "float8_e4m3fn"): torch.<name>.
std::string_view TorchDTypeName(DType dtype);
Result<DType> DTypeFromStorageClass(std::string_view name);

struct UnpickleLimits {
  int max_depth = 200;  // nesting of the result
  // Objects built while unpickling, and nodes of the result (shared
  // references count each time).
  uint64_t max_values = 1ull << 23;
};

// Parses a pickle (protocols 0-5) into a tree. `what` names the file in
// messages ("ckpt.pt: data.pkl").
// \error InvalidArgument "unknown global 'M.N' in WHAT at byte K; ptcfs loads
//        only checkpoint contents" for a global outside the allowlist.
// \error InvalidArgument naming the opcode and its byte offset for: an
//        unsupported opcode, truncated data or a missing STOP, a stack
//        underflow, an operation without its MARK, a memo index never stored,
//        an integer over 64 bits, a text that is not UTF-8, a BUILD, APPEND or
//        SETITEM applied to something that does not take it, a persistent id
//        that is not a torch storage, malformed _rebuild_tensor_v2 /
//        _rebuild_parameter / OrderedDict / _codecs.encode arguments.
// \error InvalidArgument when the result nests deeper than limits.max_depth,
//        the pickle builds or the result has more than limits.max_values
//        objects, or the result contains itself.
Result<Value> Unpickle(std::string_view data, const std::string& what, const UnpickleLimits& limits = {});

// Protocol 2 pickle of `value`: what Python's pickle.loads and
// torch.load(weights_only=True) read back (the latter for the kinds it
// allows). Bytes are written as _codecs.encode(latin-1 text, 'latin1');
// tensors as _rebuild_tensor_v2 (and _rebuild_parameter) with the persistent
// id ('storage', torch.<T>Storage, key, location, numel); an Object with
// kNewObjEx as the NEWOBJ_EX opcode (Python reads it, weights_only does not).
std::string Pickle(const Value& value);

}  // namespace ptc::pickle
