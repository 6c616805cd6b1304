// The value tree: its methods, debug printing and walks, and the torch
// storage class names.
#include "ptc/format/pickle.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <utility>

namespace ptc::pickle {
namespace {

// ---------------------------------------------------------------- helpers

constexpr DType kStorageDTypes[] = {DType::kF64, DType::kF32,  DType::kF16,    DType::kBF16,
                                    DType::kI64, DType::kI32,  DType::kI16,    DType::kI8,
                                    DType::kU8,  DType::kBool, DType::kF8E4M3, DType::kF8E5M2};
constexpr std::string_view kStorageNames[] = {
    "DoubleStorage", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage",          "IntStorage",
    "ShortStorage",  "CharStorage",  "ByteStorage", "BoolStorage",     "Float8_e4m3fnStorage", "Float8_e5m2Storage"};

std::string Repr(std::string_view s, char prefix) {
  std::string out;
  if (prefix) out.push_back(prefix);
  out.push_back('\'');
  for (char c : s) {
    const unsigned char u = c;
    if (c == '\'' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20 || u == 0x7f || (prefix && u >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  return out;
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// ---------------------------------------------------------------- tree walks

std::string KeyText(const Value& key) {
  if (key.kind() == Kind::kStr) return key.as_str();
  if (key.kind() == Kind::kInt) return std::to_string(key.as_int());
  return key.DebugString();
}

std::string Join(const std::string& path, const std::string& part) { return path.empty() ? part : path + "." + part; }

template <typename V, typename F>
void Walk(V& v, const std::string& path, const F& fn) {
  switch (v.kind()) {
    case Kind::kTensor:
      fn(path, v.tensor());
      return;
    case Kind::kList:
    case Kind::kTuple:
      for (size_t i = 0; i < v.items().size(); ++i) Walk(v.items()[i], Join(path, std::to_string(i)), fn);
      return;
    case Kind::kDict:
    case Kind::kOrderedDict:
      for (auto& kv : v.pairs()) Walk(kv.second, Join(path, KeyText(kv.first)), fn);
      return;
    case Kind::kObject: {
      auto& o = v.object();
      for (size_t i = 0; i < o.args.size(); ++i) Walk(o.args[i], Join(path, std::to_string(i)), fn);
      for (size_t i = 0; i < o.list_items.size(); ++i) Walk(o.list_items[i], Join(path, std::to_string(i)), fn);
      for (auto& kv : o.dict_items) Walk(kv.second, Join(path, KeyText(kv.first)), fn);
      if (o.state) Walk(*o.state, path, fn);
      return;
    }
    default:
      return;
  }
}

void AppendDebug(const Value& v, std::string& out);

void AppendItems(const Items& items, std::string& out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    AppendDebug(items[i], out);
  }
}

void AppendPairs(const Pairs& pairs, std::string& out) {
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i) out += ", ";
    AppendDebug(pairs[i].first, out);
    out += ": ";
    AppendDebug(pairs[i].second, out);
  }
}

void AppendDebug(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      out += FloatRepr(v.as_float());
      return;
    case Kind::kStr:
      out += Repr(v.as_str(), 0);
      return;
    case Kind::kBytes:
      out += Repr(v.as_str(), 'b');
      return;
    case Kind::kList:
      out += "[";
      AppendItems(v.items(), out);
      out += "]";
      return;
    case Kind::kTuple:
      out += "(";
      AppendItems(v.items(), out);
      out += v.items().size() == 1 ? ",)" : ")";
      return;
    case Kind::kDict:
    case Kind::kOrderedDict:
      out += v.kind() == Kind::kDict ? "{" : "OrderedDict({";
      AppendPairs(v.pairs(), out);
      out += v.kind() == Kind::kDict ? "}" : "})";
      if (v.dict_state()) {
        out += ".__dict__=";
        AppendDebug(*v.dict_state(), out);
      }
      return;
    case Kind::kTensor: {
      const Tensor& t = v.tensor();
      out += t.parameter ? "Parameter(" : "Tensor(";
      out += "storage=" + Repr(t.storage_key, 0) + ", dtype=" + std::string(DTypeName(t.dtype)) +
             ", numel=" + std::to_string(t.storage_numel) + ", offset=" + std::to_string(t.storage_offset) +
             ", shape=(";
      for (size_t i = 0; i < t.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(t.shape[i]);
      out += "), stride=(";
      for (size_t i = 0; i < t.stride.size(); ++i) out += (i ? ", " : "") + std::to_string(t.stride[i]);
      out += ")";
      if (t.requires_grad) out += ", requires_grad=True";
      out += ")";
      return;
    }
    case Kind::kGlobal:
      out += v.global().FullName();
      return;
    case Kind::kObject: {
      const Object& o = v.object();
      out += o.callable.FullName() + (o.build == Object::Build::kReduce ? "(" : ".__new__(");
      AppendItems(o.args, out);
      out += ")";
      if (!o.list_items.empty()) {
        out += ".extend([";
        AppendItems(o.list_items, out);
        out += "])";
      }
      if (!o.dict_items.empty()) {
        out += ".update({";
        AppendPairs(o.dict_items, out);
        out += "})";
      }
      if (o.state) {
        out += ".__setstate__(";
        AppendDebug(*o.state, out);
        out += ")";
      }
      return;
    }
  }
}

bool FloatBitsEqual(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

}  // namespace

// ---------------------------------------------------------------- public

std::string_view KindName(Kind kind) {
  static constexpr std::string_view kNames[] = {"None",  "bool", "int",         "float",  "str",    "bytes", "list",
                                                "tuple", "dict", "OrderedDict", "Tensor", "global", "object"};
  return kNames[static_cast<int>(kind)];
}

std::string_view StorageClassName(DType dtype) {
  for (size_t i = 0; i < std::size(kStorageDTypes); ++i) {
    if (kStorageDTypes[i] == dtype) return kStorageNames[i];
  }
  return "ByteStorage";
}

std::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
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

Result<DType> DTypeFromStorageClass(std::string_view name) {
  for (size_t i = 0; i < std::size(kStorageNames); ++i) {
    if (kStorageNames[i] == name) return kStorageDTypes[i];
  }
  return InvalidArgumentError("unknown torch storage class '" + std::string(name) + "'");
}

bool operator==(const Tensor& a, const Tensor& b) {
  return a.storage_key == b.storage_key && a.dtype == b.dtype && a.storage_numel == b.storage_numel &&
         a.location == b.location && a.storage_offset == b.storage_offset && a.shape == b.shape &&
         a.stride == b.stride && a.requires_grad == b.requires_grad && a.parameter == b.parameter &&
         a.metadata == b.metadata;
}

bool operator==(const Object& a, const Object& b) {
  return a.callable == b.callable && a.build == b.build && a.args == b.args && a.kwargs == b.kwargs &&
         a.list_items == b.list_items && a.dict_items == b.dict_items && a.state == b.state;
}

bool operator==(const DictData& a, const DictData& b) { return a.pairs == b.pairs && a.state == b.state; }

bool operator==(const Value& a, const Value& b) {
  if (a.kind_ != b.kind_) return false;
  if (a.kind_ == Kind::kFloat) return FloatBitsEqual(a.as_float(), b.as_float());
  return a.data_ == b.data_;
}

const Value* Value::Find(std::string_view key) const {
  if (!is_dict()) return nullptr;
  for (const auto& kv : pairs()) {
    if (kv.first.kind() == Kind::kStr && kv.first.as_str() == key) return &kv.second;
  }
  return nullptr;
}

Value* Value::Find(std::string_view key) { return const_cast<Value*>(std::as_const(*this).Find(key)); }

const Value* Value::Find(const Value& key) const {
  if (!is_dict()) return nullptr;
  for (const auto& kv : pairs()) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

Value* Value::Find(const Value& key) { return const_cast<Value*>(std::as_const(*this).Find(key)); }

void Value::Set(Value key, Value value) {
  if (Value* v = Find(key)) {
    *v = std::move(value);
    return;
  }
  pairs().emplace_back(std::move(key), std::move(value));
}

bool Value::Erase(std::string_view key) {
  auto& p = pairs();
  for (auto it = p.begin(); it != p.end(); ++it) {
    if (it->first.kind() == Kind::kStr && it->first.as_str() == key) {
      p.erase(it);
      return true;
    }
  }
  return false;
}

const Value* Value::GetAttr(std::string_view name) const {
  if (kind_ != Kind::kObject || !object().state) return nullptr;
  return object().state->Find(name);
}

Value* Value::GetAttr(std::string_view name) { return const_cast<Value*>(std::as_const(*this).GetAttr(name)); }

Status Value::SetAttr(std::string_view name, Value value) {
  if (kind_ != Kind::kObject)
    return InvalidArgumentError("cannot set attribute '" + std::string(name) + "' of a " +
                                std::string(KindName(kind_)));
  Object& o = object();
  if (!o.state) o.state = Boxed<Value>(Value::Dict());
  if (!o.state->is_dict())
    return InvalidArgumentError("cannot set attribute '" + std::string(name) + "' of a " + o.callable.FullName() +
                                " object whose state is a " + std::string(KindName(o.state->kind())));
  o.state->Set(name, std::move(value));
  return Status::OK();
}

namespace {

// DictIndex's text of a key, or nullopt for a key of another kind.
std::optional<std::string> IndexKey(const Value& key) {
  if (key.kind() == Kind::kStr) return "s" + key.as_str();
  if (key.kind() == Kind::kInt) return "i" + std::to_string(key.as_int());
  return std::nullopt;
}

}  // namespace

const Value* DictIndex::Find(const Value& dict, const Value& key) {
  if (!dict.is_dict()) return nullptr;
  std::optional<std::string> text = IndexKey(key);
  if (!text) return dict.Find(key);
  auto [at, fresh] = by_dict_.try_emplace(&dict);
  if (fresh) {
    for (const auto& [k, v] : dict.pairs()) {
      if (std::optional<std::string> t = IndexKey(k)) at->second.try_emplace(std::move(*t), &v);
    }
  }
  const auto found = at->second.find(*text);
  return found == at->second.end() ? nullptr : found->second;
}

const Value* DictIndex::Find(const Value& dict, std::string_view key) {
  return Find(dict, Value::Str(std::string(key)));
}

std::string Value::DebugString() const {
  std::string out;
  AppendDebug(*this, out);
  return out;
}

void ForEachTensor(const Value& root, const std::function<void(const std::string& path, const Tensor&)>& fn) {
  Walk(root, "", fn);
}

void ForEachTensor(Value& root, const std::function<void(const std::string& path, Tensor&)>& fn) { Walk(root, "", fn); }

}  // namespace ptc::pickle
