// The protocol-2 pickler.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ptc/format/little_endian.h"
#include "ptc/format/pickle.h"
#include "ptc/format/pickle_internal.h"

namespace ptc::pickle {
namespace {

using enum internal::Op;  // the opcodes, shared with the unpickler
using internal::Latin1ToUtf8;
using ::ptc::internal::PutLittleEndian;

// ---------------------------------------------------------------- Pickle

class Pickler {
 public:
  std::string Run(const Value& v) {
    out_ += static_cast<char>(kProto);
    out_ += '\x02';
    Write(v);
    out_ += static_cast<char>(kStop);
    return std::move(out_);
  }

 private:
  void Op(uint8_t op) { out_ += static_cast<char>(op); }
  void U32(uint32_t v) { PutLittleEndian(out_, v, 4); }
  void GlobalOp(std::string_view module, std::string_view name) {
    Op(kGlobal);
    out_.append(module).append("\n").append(name).append("\n");
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      Op(kBinInt1);
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      Op(kBinInt2);
      PutLittleEndian(out_, static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      Op(kBinInt);
      U32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      std::string bytes;  // minimal two's complement, little-endian
      int64_t x = v;
      while (true) {
        bytes += static_cast<char>(x & 0xff);
        const bool sign = (x & 0x80) != 0;
        x >>= 8;  // arithmetic
        if ((x == 0 && !sign) || (x == -1 && sign)) break;
      }
      Op(kLong1);
      out_ += static_cast<char>(bytes.size());
      out_ += bytes;
    }
  }
  void UInt(uint64_t v) {
    if (v <= static_cast<uint64_t>(INT64_MAX)) return Int(static_cast<int64_t>(v));
    Op(kLong1);
    out_ += '\x09';
    PutLittleEndian(out_, v, 8);
    out_ += '\0';  // a 9th byte, so that v >= 2^63 reads as positive
  }
  void Str(std::string_view s) {
    Op(kBinUnicode);
    U32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void EmptyOrderedDict() {
    GlobalOp("collections", "OrderedDict");
    Op(kEmptyTuple);
    Op(kReduce);
  }
  void TupleOf(const Items& items) {
    if (items.empty()) return Op(kEmptyTuple);
    if (items.size() > 3) Op(kMark);
    for (const Value& v : items) Write(v);
    static constexpr uint8_t kSmall[] = {0, kTuple1, kTuple2, kTuple3};
    Op(items.size() > 3 ? static_cast<uint8_t>(kTuple) : kSmall[items.size()]);
  }
  void IntTuple(const std::vector<int64_t>& v) {
    Items items;
    for (int64_t x : v) items.push_back(Value::Int(x));
    TupleOf(items);
  }
  // Appends `items` to the list (or object) on top of the stack, 1000 at a time.
  void Appends(const Items& items) {
    for (size_t at = 0; at < items.size(); at += 1000) {
      const size_t end = std::min(items.size(), at + 1000);
      if (end - at == 1) {
        Write(items[at]);
        Op(kAppend);
        continue;
      }
      Op(kMark);
      for (size_t i = at; i < end; ++i) Write(items[i]);
      Op(kAppends);
    }
  }
  void SetItems(const Pairs& pairs) {
    for (size_t at = 0; at < pairs.size(); at += 1000) {
      const size_t end = std::min(pairs.size(), at + 1000);
      if (end - at == 1) {
        Write(pairs[at].first);
        Write(pairs[at].second);
        Op(kSetItem);
        continue;
      }
      Op(kMark);
      for (size_t i = at; i < end; ++i) {
        Write(pairs[i].first);
        Write(pairs[i].second);
      }
      Op(kSetItems);
    }
  }
  void TensorCore(const Tensor& t, bool requires_grad) {
    GlobalOp("torch._utils", "_rebuild_tensor_v2");
    Op(kMark);
    Op(kMark);
    Str("storage");
    GlobalOp("torch", StorageClassName(t.dtype));
    Str(t.storage_key);
    Str(t.location);
    UInt(t.storage_numel);
    Op(kTuple);
    Op(kBinPersId);
    Int(t.storage_offset);
    IntTuple(t.shape);
    IntTuple(t.stride);
    Op(requires_grad ? kNewTrue : kNewFalse);
    EmptyOrderedDict();
    if (t.metadata) Write(*t.metadata);
    Op(kTuple);
    Op(kReduce);
  }
  void WriteTensor(const Tensor& t) {
    if (!t.parameter) return TensorCore(t, t.requires_grad);
    GlobalOp("torch._utils", "_rebuild_parameter");
    Op(kMark);
    TensorCore(t, false);
    Op(t.requires_grad ? kNewTrue : kNewFalse);
    EmptyOrderedDict();
    Op(kTuple);
    Op(kReduce);
  }
  void WriteObject(const Object& o) {
    GlobalOp(o.callable.module, o.callable.name);
    TupleOf(o.args);
    if (o.build == Object::Build::kReduce) {
      Op(kReduce);
    } else if (o.build == Object::Build::kNewObj) {
      Op(kNewObj);
    } else {
      if (o.kwargs) {
        Write(*o.kwargs);
      } else {
        Op(kEmptyDict);
      }
      Op(kNewObjEx);
    }
    Appends(o.list_items);
    SetItems(o.dict_items);
    if (o.state) {
      Write(*o.state);
      Op(kBuild);
    }
  }
  void Write(const Value& v) {
    switch (v.kind()) {
      case Kind::kNone:
        return Op(kNone);
      case Kind::kBool:
        return Op(v.as_bool() ? kNewTrue : kNewFalse);
      case Kind::kInt:
        return Int(v.as_int());
      case Kind::kFloat: {
        Op(kBinFloat);
        uint64_t bits;
        const double f = v.as_float();
        std::memcpy(&bits, &f, 8);
        for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
        return;
      }
      case Kind::kStr:
        return Str(v.as_str());
      case Kind::kBytes:
        GlobalOp("_codecs", "encode");
        Str(Latin1ToUtf8(v.as_str()));
        Str("latin1");
        Op(kTuple2);
        return Op(kReduce);
      case Kind::kList:
        Op(kEmptyList);
        return Appends(v.items());
      case Kind::kTuple:
        return TupleOf(v.items());
      case Kind::kDict:
        Op(kEmptyDict);
        return SetItems(v.pairs());
      case Kind::kOrderedDict:
        EmptyOrderedDict();
        SetItems(v.pairs());
        if (v.dict_state()) {
          Write(*v.dict_state());
          Op(kBuild);
        }
        return;
      case Kind::kTensor:
        return WriteTensor(v.tensor());
      case Kind::kGlobal:
        return GlobalOp(v.global().module, v.global().name);
      case Kind::kObject:
        return WriteObject(v.object());
    }
  }

  std::string out_;
};

}  // namespace

std::string Pickle(const Value& value) { return Pickler().Run(value); }

}  // namespace ptc::pickle
