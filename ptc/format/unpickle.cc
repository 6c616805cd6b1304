// The restricted unpickler.
//
// Unpickling runs in two phases. The stack machine builds a graph of Nodes in
// an arena with Python's reference semantics (the memo holds references, so
// an OrderedDict memoized before its SETITEMS is complete when fetched back).
// The graph is then copied into a Value tree, bounded in depth and size, which
// also rejects a structure that contains itself.
#include "ptc/format/pickle.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "ptc/format/pickle_internal.h"

namespace ptc::pickle {
namespace {

using enum internal::Op;  // the opcodes, shared with the pickler
using internal::AppendUtf8;

// ---------------------------------------------------------------- helpers

// Accepts UTF-8 as Python's "surrogatepass" decoder does (lone surrogates allowed).
bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
    i += n + 1;
  }
  return true;
}

// UTF-8 text of code points < 256 back to bytes; false otherwise.
bool Utf8ToLatin1(std::string_view text, std::string* out) {
  out->clear();
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = text[i];
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if ((c == 0xC2 || c == 0xC3) && i + 1 < text.size()) {
      out->push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++i]) & 0x3F)));
    } else {
      return false;
    }
  }
  return true;
}

// Python's raw-unicode-escape: \uXXXX and \UXXXXXXXX, all other bytes latin-1.
bool RawUnicodeEscapeToUtf8(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      const size_t digits = s[i + 1] == 'u' ? 4 : 8;
      if (i + 2 + digits > s.size()) return false;
      uint32_t cp = 0;
      auto r = std::from_chars(s.data() + i + 2, s.data() + i + 2 + digits, cp, 16);
      if (r.ec != std::errc() || r.ptr != s.data() + i + 2 + digits || cp > 0x10FFFF) return false;
      AppendUtf8(*out, cp);
      i += 1 + digits;
    } else {
      AppendUtf8(*out, static_cast<unsigned char>(s[i]));
    }
  }
  return true;
}

// Python 2 module names that protocol 0-2 pickles may use.
std::string FixModule(std::string module) {
  if (module == "__builtin__") return "builtins";
  if (module == "copy_reg") return "copyreg";
  return module;
}

bool IsTorchDTypeName(std::string_view n) {
  static constexpr std::string_view kNames[] = {
      "float64",  "double", "float32", "float",   "float16",       "half",        "bfloat16", "int64",
      "long",     "int32",  "int",     "int16",   "short",         "int8",        "uint8",    "bool",
      "complex32", "chalf", "complex64", "cfloat", "complex128",   "cdouble",     "float8_e4m3fn",
      "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32",     "uint64",   "qint8",
      "quint8",   "qint32", "quint4x2"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

bool IsAllowedGlobal(const std::string& module, const std::string& name) {
  if (module == "megatron" || module.rfind("megatron.", 0) == 0) return !name.empty();
  const std::string full = module + "." + name;
  static constexpr std::string_view kAllowed[] = {
      "collections.OrderedDict",
      "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_parameter",
      "torch.Size",
      "argparse.Namespace",
      "_codecs.encode",
      "builtins.set",
      "builtins.frozenset",
      "builtins.slice",
      "builtins.bytes",
      "builtins.object",
      "builtins.getattr",  // only getattr(<megatron class>, name): enums pickled by Python 3.11
      "copyreg._reconstructor",
      "numpy.core.multiarray._reconstruct",
      "numpy._core.multiarray._reconstruct",
      "numpy.core.multiarray.scalar",
      "numpy._core.multiarray.scalar",
      "numpy.core.numeric._frombuffer",
      "numpy._core.numeric._frombuffer",
      "numpy.ndarray",
      "numpy.dtype",
  };
  if (std::find(std::begin(kAllowed), std::end(kAllowed), full) != std::end(kAllowed)) return true;
  if (module == "torch") return IsTorchDTypeName(name) || DTypeFromStorageClass(name).ok();
  return false;
}

// ---------------------------------------------------------------- opcodes

std::string OpName(uint8_t op) {
  switch (op) {
#define PTC_OP(c, n) case c: return n;
    PTC_OP(kMark, "MARK") PTC_OP(kStop, "STOP") PTC_OP(kPop, "POP") PTC_OP(kPopMark, "POP_MARK")
    PTC_OP(kDup, "DUP") PTC_OP(kFloat, "FLOAT") PTC_OP(kInt, "INT") PTC_OP(kBinInt, "BININT")
    PTC_OP(kBinInt1, "BININT1") PTC_OP(kLong, "LONG") PTC_OP(kBinInt2, "BININT2") PTC_OP(kNone, "NONE")
    PTC_OP(kPersId, "PERSID") PTC_OP(kBinPersId, "BINPERSID") PTC_OP(kReduce, "REDUCE")
    PTC_OP(kString, "STRING") PTC_OP(kBinString, "BINSTRING") PTC_OP(kShortBinString, "SHORT_BINSTRING")
    PTC_OP(kUnicode, "UNICODE") PTC_OP(kBinUnicode, "BINUNICODE") PTC_OP(kAppend, "APPEND")
    PTC_OP(kBuild, "BUILD") PTC_OP(kGlobal, "GLOBAL") PTC_OP(kDict, "DICT") PTC_OP(kEmptyDict, "EMPTY_DICT")
    PTC_OP(kAppends, "APPENDS") PTC_OP(kGet, "GET") PTC_OP(kBinGet, "BINGET") PTC_OP(kInst, "INST")
    PTC_OP(kLongBinGet, "LONG_BINGET") PTC_OP(kList, "LIST") PTC_OP(kEmptyList, "EMPTY_LIST")
    PTC_OP(kObj, "OBJ") PTC_OP(kPut, "PUT") PTC_OP(kBinPut, "BINPUT") PTC_OP(kLongBinPut, "LONG_BINPUT")
    PTC_OP(kSetItem, "SETITEM") PTC_OP(kTuple, "TUPLE") PTC_OP(kEmptyTuple, "EMPTY_TUPLE")
    PTC_OP(kSetItems, "SETITEMS") PTC_OP(kBinFloat, "BINFLOAT") PTC_OP(kProto, "PROTO")
    PTC_OP(kNewObj, "NEWOBJ") PTC_OP(kExt1, "EXT1") PTC_OP(kExt2, "EXT2") PTC_OP(kExt4, "EXT4")
    PTC_OP(kTuple1, "TUPLE1") PTC_OP(kTuple2, "TUPLE2") PTC_OP(kTuple3, "TUPLE3") PTC_OP(kNewTrue, "NEWTRUE")
    PTC_OP(kNewFalse, "NEWFALSE") PTC_OP(kLong1, "LONG1") PTC_OP(kLong4, "LONG4") PTC_OP(kBinBytes, "BINBYTES")
    PTC_OP(kShortBinBytes, "SHORT_BINBYTES") PTC_OP(kShortBinUnicode, "SHORT_BINUNICODE")
    PTC_OP(kBinUnicode8, "BINUNICODE8") PTC_OP(kBinBytes8, "BINBYTES8") PTC_OP(kEmptySet, "EMPTY_SET")
    PTC_OP(kAddItems, "ADDITEMS") PTC_OP(kFrozenSet, "FROZENSET") PTC_OP(kNewObjEx, "NEWOBJ_EX")
    PTC_OP(kStackGlobal, "STACK_GLOBAL") PTC_OP(kMemoize, "MEMOIZE") PTC_OP(kFrame, "FRAME")
    PTC_OP(kByteArray8, "BYTEARRAY8") PTC_OP(kNextBuffer, "NEXT_BUFFER") PTC_OP(kReadOnlyBuffer, "READONLY_BUFFER")
#undef PTC_OP
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "opcode 0x%02x", op);
  return buf;
}

// ---------------------------------------------------------------- the graph

enum class NK : uint8_t {
  kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict, kOrderedDict, kTensor, kGlobal, kObject,
  kStorage,  // a persistent id resolved to a torch storage; only an argument of _rebuild_tensor_v2
};

struct StorageRef {
  std::string key;
  DType dtype;
  std::string location;
  uint64_t numel;
};

struct Node {
  explicit Node(NK k) : kind(k) {}
  NK kind;
  bool on_path = false;  // conversion: cycle detection
  Object::Build build = Object::Build::kReduce;
  int64_t i = 0;         // kBool, kInt; index into tensors / storages for kTensor / kStorage
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

class Unpickler {
 public:
  Unpickler(std::string_view data, const std::string& what, const UnpickleLimits& limits)
      : data_(data), what_(what), limits_(limits) {}

  Result<Value> Run() {
    bool done = false;
    while (!done) {
      if (pos_ >= data_.size())
        return InvalidArgumentError(what_ + ": pickle ends at byte " + std::to_string(pos_) + " without STOP");
      op_pos_ = pos_;
      op_ = static_cast<uint8_t>(data_[pos_++]);
      PTC_RETURN_IF_ERROR(Step(&done));
      PTC_RETURN_IF_ERROR(CheckArena());
    }
    return Convert(stack_.back(), 0);
  }

 private:
  Status Err(const std::string& message) const {
    return InvalidArgumentError(what_ + ": " + OpName(op_) + " at byte " + std::to_string(op_pos_) + ": " + message);
  }

  Node* New(NK kind) {
    arena_.push_back(std::make_unique<Node>(kind));
    return arena_.back().get();
  }
  // Bounds the memory of the graph (each opcode creates at most one node).
  Status CheckArena() const {
    if (arena_.size() > limits_.max_values)
      return Err("more than " + std::to_string(limits_.max_values) + " objects in the pickle");
    return Status::OK();
  }
  Node* NewStr(NK kind, std::string s) {
    Node* n = New(kind);
    n->s = std::move(s);
    return n;
  }
  Node* NewInt(NK kind, int64_t i) {
    Node* n = New(kind);
    n->i = i;
    return n;
  }

  Result<std::string_view> Take(uint64_t n) {
    if (n > data_.size() - pos_)
      return Err("needs " + std::to_string(n) + " bytes, " + std::to_string(data_.size() - pos_) +
                 " left (truncated pickle)");
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Result<uint64_t> TakeUInt(int bytes) {
    PTC_ASSIGN_OR_RETURN(std::string_view s, Take(bytes));
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(s[k]);
    return v;
  }
  Result<std::string_view> Line() {
    const size_t nl = data_.find('\n', pos_);
    if (nl == std::string_view::npos) return Err("line without its newline (truncated pickle)");
    std::string_view s = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }
  Result<int64_t> ParseDecimal(std::string_view s) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    int64_t v = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec == std::errc::result_out_of_range) return Err("integer " + std::string(s.substr(0, 40)) + " exceeds 64 bits");
    if (r.ec != std::errc() || r.ptr != s.data() + s.size() || s.empty())
      return Err("'" + std::string(s.substr(0, 40)) + "' is not a decimal integer");
    return v;
  }
  Result<int64_t> DecodeLong(std::string_view bytes) {
    if (bytes.size() > 8) return Err("integer of " + std::to_string(bytes.size()) + " bytes exceeds 64 bits");
    if (bytes.empty()) return int64_t{0};
    uint64_t v = 0;
    for (size_t k = bytes.size(); k-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[k]);
    if (bytes.size() < 8 && (static_cast<unsigned char>(bytes.back()) & 0x80)) v |= ~uint64_t{0} << (8 * bytes.size());
    return static_cast<int64_t>(v);
  }

  size_t Available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  Result<Node*> Pop() {
    if (Available() == 0) return Err(marks_.empty() ? "stack underflow" : "stack underflow (below the MARK)");
    Node* n = stack_.back();
    stack_.pop_back();
    return n;
  }
  Result<Node*> Top() {
    if (Available() == 0) return Err(marks_.empty() ? "stack underflow" : "stack underflow (below the MARK)");
    return stack_.back();
  }
  Result<std::vector<Node*>> PopMark() {
    if (marks_.empty()) return Err("no MARK before it");
    std::vector<Node*> items(stack_.begin() + static_cast<ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void Push(Node* n) { stack_.push_back(n); }

  Status Put(uint64_t index) {
    PTC_ASSIGN_OR_RETURN(Node * top, Top());
    memo_[index] = top;
    return Status::OK();
  }
  Status Get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Err("memo index " + std::to_string(index) + " was never stored");
    Push(it->second);
    return Status::OK();
  }
  Result<Node*> Text(NK kind, std::string_view bytes) {
    if (kind == NK::kStr && !IsUtf8(bytes)) return Err("text is not UTF-8");
    return NewStr(kind, std::string(bytes));
  }
  Status PushText(NK kind, int len_bytes) {
    PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(len_bytes));
    PTC_ASSIGN_OR_RETURN(std::string_view s, Take(n));
    PTC_ASSIGN_OR_RETURN(Node * node, Text(kind, s));
    Push(node);
    return Status::OK();
  }
  Node* NewTuple(std::vector<Node*> items) {
    Node* t = New(NK::kTuple);
    t->items = std::move(items);
    return t;
  }
  Status TupleN(size_t n) {
    if (Available() < n) return Err("stack underflow");
    std::vector<Node*> items(stack_.end() - static_cast<ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    Push(NewTuple(std::move(items)));
    return Status::OK();
  }

  Status PushGlobal(std::string module, std::string name) {
    module = FixModule(std::move(module));
    if (!IsAllowedGlobal(module, name))
      return InvalidArgumentError("unknown global '" + module + "." + name + "' in " + what_ + " at byte " +
                                  std::to_string(op_pos_) + "; ptcfs loads only checkpoint contents");
    Node* g = New(NK::kGlobal);
    g->global = Global{std::move(module), std::move(name)};
    Push(g);
    return Status::OK();
  }

  Status Append(Node* target, std::vector<Node*> items) {
    if (target->kind != NK::kList && target->kind != NK::kObject)
      return Err("cannot append to a " + NodeKindName(target));
    target->items.insert(target->items.end(), items.begin(), items.end());
    return Status::OK();
  }
  Status SetItems(Node* target, const std::vector<Node*>& kv) {
    if (kv.size() % 2 != 0) return Err("odd number of keys and values");
    if (target->kind != NK::kDict && target->kind != NK::kOrderedDict && target->kind != NK::kObject)
      return Err("cannot set items of a " + NodeKindName(target));
    for (size_t k = 0; k < kv.size(); k += 2) target->pairs.emplace_back(kv[k], kv[k + 1]);
    return Status::OK();
  }

  static std::string NodeKindName(const Node* n) {
    if (n->kind == NK::kStorage) return "torch storage";
    if (n->kind == NK::kObject) return n->global.FullName() + " object";
    if (n->kind == NK::kGlobal) return "global " + n->global.FullName();
    return std::string(KindName(static_cast<Kind>(n->kind)));
  }

  Status Step(bool* done);
  Status StepMore(bool* done);
  Status Reduce();
  Status Build();
  Result<Node*> Call(const Global& g, Node* args);
  Result<Node*> RebuildTensor(const std::vector<Node*>& a);
  Result<Node*> RebuildParameter(const std::vector<Node*>& a);
  Result<Node*> PersistentLoad(Node* pid);
  Result<std::vector<int64_t>> IntTuple(Node* n, const char* what);
  Result<Value> Convert(Node* n, int depth);
  Result<Items> ConvertAll(const std::vector<Node*>& nodes, int depth);
  Result<Pairs> ConvertPairs(const std::vector<std::pair<Node*, Node*>>& pairs, int depth);

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

Status Unpickler::Step(bool* done) {
  switch (op_) {
    case kProto: {
      PTC_ASSIGN_OR_RETURN(uint64_t v, TakeUInt(1));
      if (v > 5) return Err("unsupported pickle protocol " + std::to_string(v));
      return Status::OK();
    }
    case kFrame: {
      PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(8));
      if (n > data_.size() - pos_) return Err("frame of " + std::to_string(n) + " bytes runs past the end");
      return Status::OK();
    }
    case kStop:
      if (stack_.empty()) return Err("stack underflow (nothing to return)");
      *done = true;
      return Status::OK();
    case kMark:
      marks_.push_back(stack_.size());
      return Status::OK();
    case kPop:
      if (Available() == 0 && !marks_.empty()) return PopMark().status();
      return Pop().status();
    case kPopMark:
      return PopMark().status();
    case kDup: {
      PTC_ASSIGN_OR_RETURN(Node * top, Top());
      Push(top);
      return Status::OK();
    }
    case kPut: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      PTC_ASSIGN_OR_RETURN(int64_t i, ParseDecimal(line));
      if (i < 0) return Err("negative memo index");
      return Put(static_cast<uint64_t>(i));
    }
    case kBinPut: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(1));
      return Put(i);
    }
    case kLongBinPut: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(4));
      return Put(i);
    }
    case kMemoize:
      return Put(memo_.size());
    case kGet: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      PTC_ASSIGN_OR_RETURN(int64_t i, ParseDecimal(line));
      return Get(static_cast<uint64_t>(i));
    }
    case kBinGet: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(1));
      return Get(i);
    }
    case kLongBinGet: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(4));
      return Get(i);
    }
    case kNone:
      Push(New(NK::kNone));
      return Status::OK();
    case kNewTrue:
    case kNewFalse:
      Push(NewInt(NK::kBool, op_ == kNewTrue));
      return Status::OK();
    case kInt: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      if (line == "00" || line == "01") {
        Push(NewInt(NK::kBool, line == "01"));
        return Status::OK();
      }
      PTC_ASSIGN_OR_RETURN(int64_t v, ParseDecimal(line));
      Push(NewInt(NK::kInt, v));
      return Status::OK();
    }
    case kLong: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      PTC_ASSIGN_OR_RETURN(int64_t v, ParseDecimal(line));
      Push(NewInt(NK::kInt, v));
      return Status::OK();
    }
    case kBinInt: {
      PTC_ASSIGN_OR_RETURN(uint64_t v, TakeUInt(4));
      Push(NewInt(NK::kInt, static_cast<int32_t>(static_cast<uint32_t>(v))));
      return Status::OK();
    }
    case kBinInt1:
    case kBinInt2: {
      PTC_ASSIGN_OR_RETURN(uint64_t v, TakeUInt(op_ == kBinInt1 ? 1 : 2));
      Push(NewInt(NK::kInt, static_cast<int64_t>(v)));
      return Status::OK();
    }
    case kLong1:
    case kLong4: {
      PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(op_ == kLong1 ? 1 : 4));
      if (n > 0x7FFFFFFF) return Err("negative byte count");
      PTC_ASSIGN_OR_RETURN(std::string_view bytes, Take(n));
      PTC_ASSIGN_OR_RETURN(int64_t v, DecodeLong(bytes));
      Push(NewInt(NK::kInt, v));
      return Status::OK();
    }
    case kFloat: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      double f = 0;
      auto r = std::from_chars(line.data(), line.data() + line.size(), f);
      if (r.ec != std::errc() || r.ptr != line.data() + line.size())
        return Err("'" + std::string(line.substr(0, 40)) + "' is not a float");
      Node* n = New(NK::kFloat);
      n->f = f;
      Push(n);
      return Status::OK();
    }
    case kBinFloat: {
      PTC_ASSIGN_OR_RETURN(std::string_view s, Take(8));
      uint64_t bits = 0;
      for (char c : s) bits = (bits << 8) | static_cast<unsigned char>(c);  // big-endian
      Node* n = New(NK::kFloat);
      std::memcpy(&n->f, &bits, 8);
      Push(n);
      return Status::OK();
    }
    case kBinUnicode: return PushText(NK::kStr, 4);
    case kShortBinUnicode: return PushText(NK::kStr, 1);
    case kBinUnicode8: return PushText(NK::kStr, 8);
    case kBinString: {
      PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(4));
      if (n > 0x7FFFFFFF) return Err("negative length");
      PTC_ASSIGN_OR_RETURN(std::string_view s, Take(n));
      Push(NewStr(NK::kBytes, std::string(s)));
      return Status::OK();
    }
    case kShortBinString: return PushText(NK::kBytes, 1);
    case kBinBytes: return PushText(NK::kBytes, 4);
    case kShortBinBytes: return PushText(NK::kBytes, 1);
    case kBinBytes8: return PushText(NK::kBytes, 8);
    case kByteArray8: return PushText(NK::kBytes, 8);
    case kUnicode: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      std::string text;
      if (!RawUnicodeEscapeToUtf8(line, &text)) return Err("malformed raw-unicode-escape text");
      Push(NewStr(NK::kStr, std::move(text)));
      return Status::OK();
    }
    default:
      return StepMore(done);
  }
}

Status Unpickler::StepMore(bool* done) {
  switch (op_) {
    case kEmptyTuple:
      Push(NewTuple({}));
      return Status::OK();
    case kTuple: {
      PTC_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark());
      Push(NewTuple(std::move(items)));
      return Status::OK();
    }
    case kTuple1: return TupleN(1);
    case kTuple2: return TupleN(2);
    case kTuple3: return TupleN(3);
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
    case kNewObjEx: {
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
      return Err("persistent id '" + std::string(line.substr(0, 40)) + "' is not a torch storage");
    }
    default:
      return Err("unsupported opcode (ptcfs reads the pickles torch.save writes)");
  }
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
       (a[0]->global.module != "megatron" && a[0]->global.module.rfind("megatron.", 0) != 0)))
    return Err("builtins.getattr is read only as getattr(<class under megatron.>, name)");
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
  if (a[0]->kind != NK::kStorage) return Err("_rebuild_tensor_v2 argument 1 is a " + NodeKindName(a[0]) + ", not a storage");
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
  if (a[0]->kind != NK::kTensor) return Err("_rebuild_parameter argument 1 is a " + NodeKindName(a[0]) + ", not a tensor");
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

Result<Items> Unpickler::ConvertAll(const std::vector<Node*>& nodes, int depth) {
  Items out;
  out.reserve(nodes.size());
  for (Node* n : nodes) {
    PTC_ASSIGN_OR_RETURN(Value v, Convert(n, depth));
    out.push_back(std::move(v));
  }
  return out;
}

Result<Pairs> Unpickler::ConvertPairs(const std::vector<std::pair<Node*, Node*>>& pairs, int depth) {
  Pairs out;
  out.reserve(pairs.size());
  for (const auto& [k, v] : pairs) {
    PTC_ASSIGN_OR_RETURN(Value key, Convert(k, depth));
    PTC_ASSIGN_OR_RETURN(Value value, Convert(v, depth));
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
    case NK::kNone: return Value::None();
    case NK::kBool: return Value::Bool(n->i != 0);
    case NK::kInt: return Value::Int(n->i);
    case NK::kFloat: return Value::Float(n->f);
    case NK::kStr: return Value::Str(n->s);
    case NK::kBytes: return Value::Bytes(n->s);
    case NK::kList:
    case NK::kTuple: {
      PTC_ASSIGN_OR_RETURN(Items items, ConvertAll(n->items, depth));
      return n->kind == NK::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case NK::kDict:
    case NK::kOrderedDict: {
      PTC_ASSIGN_OR_RETURN(Pairs pairs, ConvertPairs(n->pairs, depth));
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
    case NK::kGlobal: return Value::FromGlobal(n->global);
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
      PTC_ASSIGN_OR_RETURN(o.dict_items, ConvertPairs(n->pairs, depth));
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

}  // namespace

Result<Value> Unpickle(std::string_view data, const std::string& what, const UnpickleLimits& limits) {
  return Unpickler(data, what, limits).Run();
}

}  // namespace ptc::pickle
