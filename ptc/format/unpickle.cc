// The restricted unpickler's machine: the opcode loop and its dispatch to the
// opcode families, the input, the stack, the memo and the arena; and the entry
// point. The phases and the files: unpickle_internal.h.
#include <charconv>
#include <cstdio>
#include <memory>
#include <utility>

#include "ptc/format/little_endian.h"
#include "ptc/format/pickle.h"
#include "ptc/format/unpickle_internal.h"

namespace ptc::pickle {
namespace internal {
namespace {

// The name Python's pickletools gives the opcode, for messages.

std::string OpName(uint8_t op) {
  switch (op) {
#define PTC_OP(c, n) \
  case c:            \
    return n;
    PTC_OP(kMark, "MARK")
    PTC_OP(kStop, "STOP")
    PTC_OP(kPop, "POP") PTC_OP(kPopMark, "POP_MARK") PTC_OP(kDup, "DUP") PTC_OP(kFloat, "FLOAT") PTC_OP(kInt, "INT")
        PTC_OP(kBinInt, "BININT") PTC_OP(kBinInt1, "BININT1") PTC_OP(kLong, "LONG") PTC_OP(kBinInt2, "BININT2") PTC_OP(
            kNone, "NONE") PTC_OP(kPersId, "PERSID") PTC_OP(kBinPersId, "BINPERSID") PTC_OP(kReduce, "REDUCE")
            PTC_OP(kString, "STRING") PTC_OP(kBinString, "BINSTRING") PTC_OP(kShortBinString, "SHORT_BINSTRING") PTC_OP(
                kUnicode, "UNICODE") PTC_OP(kBinUnicode, "BINUNICODE") PTC_OP(kAppend, "APPEND") PTC_OP(kBuild, "BUILD")
                PTC_OP(kGlobal, "GLOBAL") PTC_OP(kDict, "DICT") PTC_OP(kEmptyDict, "EMPTY_DICT") PTC_OP(
                    kAppends, "APPENDS") PTC_OP(kGet, "GET") PTC_OP(kBinGet, "BINGET") PTC_OP(kInst, "INST")
                    PTC_OP(kLongBinGet, "LONG_BINGET") PTC_OP(kList, "LIST") PTC_OP(kEmptyList, "EMPTY_LIST")
                        PTC_OP(kObj, "OBJ") PTC_OP(kPut, "PUT") PTC_OP(kBinPut, "BINPUT") PTC_OP(
                            kLongBinPut, "LONG_BINPUT") PTC_OP(kSetItem, "SETITEM") PTC_OP(kTuple, "TUPLE")
                            PTC_OP(kEmptyTuple, "EMPTY_TUPLE") PTC_OP(kSetItems, "SETITEMS")
                                PTC_OP(kBinFloat, "BINFLOAT") PTC_OP(kProto, "PROTO") PTC_OP(kNewObj, "NEWOBJ") PTC_OP(
                                    kExt1, "EXT1") PTC_OP(kExt2, "EXT2") PTC_OP(kExt4, "EXT4") PTC_OP(kTuple1, "TUPLE1")
                                    PTC_OP(kTuple2, "TUPLE2") PTC_OP(kTuple3, "TUPLE3") PTC_OP(kNewTrue, "NEWTRUE")
                                        PTC_OP(kNewFalse, "NEWFALSE") PTC_OP(kLong1, "LONG1") PTC_OP(kLong4, "LONG4")
                                            PTC_OP(kBinBytes, "BINBYTES") PTC_OP(kShortBinBytes, "SHORT_BINBYTES")
                                                PTC_OP(kShortBinUnicode, "SHORT_BINUNICODE") PTC_OP(
                                                    kBinUnicode8, "BINUNICODE8") PTC_OP(kBinBytes8, "BINBYTES8")
                                                    PTC_OP(kEmptySet, "EMPTY_SET") PTC_OP(kAddItems, "ADDITEMS")
                                                        PTC_OP(kFrozenSet, "FROZENSET") PTC_OP(kNewObjEx, "NEWOBJ_EX")
                                                            PTC_OP(kStackGlobal, "STACK_GLOBAL")
                                                                PTC_OP(kMemoize, "MEMOIZE") PTC_OP(kFrame, "FRAME")
                                                                    PTC_OP(kByteArray8, "BYTEARRAY8")
                                                                        PTC_OP(kNextBuffer, "NEXT_BUFFER")
                                                                            PTC_OP(kReadOnlyBuffer, "READONLY_BUFFER")
#undef PTC_OP
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "opcode 0x%02x", op);
  return buf;
}

}  // namespace

std::string QuotedExcerpt(std::string_view s) {
  std::string quoted = "'";
  quoted.append(s.substr(0, 40)).push_back('\'');
  return quoted;
}

// ---------------------------------------------------------------- the loop

Result<Value> Unpickler::Run() {
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

// The families take disjoint sets of opcodes, so the order of asking only
// matters for speed: the machine's and the constants' opcodes are the commonest.
Status Unpickler::Step(bool* done) {
  if (Handled s = StepMachine(done)) return *std::move(s);
  if (Handled s = StepLiteral()) return *std::move(s);
  if (Handled s = StepContainer()) return *std::move(s);
  if (Handled s = StepObject()) return *std::move(s);
  return Err("unsupported opcode (ptcfs reads the pickles torch.save writes)");
}

Handled Unpickler::StepMachine(bool* done) {
  switch (op_) {
    case kProto: {
      PTC_ASSIGN_OR_RETURN(uint64_t v, TakeUInt(1));
      if (v > 5) return Err("unsupported pickle protocol " + std::to_string(v));
      return Status::OK();
    }
    case kFrame: {  // framing only groups opcodes for buffered reads: check the length, read on
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
    case kBinPut:
    case kLongBinPut: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(op_ == kBinPut ? 1 : 4));
      return Put(i);
    }
    case kMemoize:
      return Put(memo_.size());
    case kGet: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      PTC_ASSIGN_OR_RETURN(int64_t i, ParseDecimal(line));
      return Get(static_cast<uint64_t>(i));
    }
    case kBinGet:
    case kLongBinGet: {
      PTC_ASSIGN_OR_RETURN(uint64_t i, TakeUInt(op_ == kBinGet ? 1 : 4));
      return Get(i);
    }
    default:
      return std::nullopt;
  }
}

Status Unpickler::Err(const std::string& message) const {
  return InvalidArgumentError(what_ + ": " + OpName(op_) + " at byte " + std::to_string(op_pos_) + ": " + message);
}

// ---------------------------------------------------------------- the arena

Node* Unpickler::New(NK kind) {
  arena_.push_back(std::make_unique<Node>(kind));
  return arena_.back().get();
}

Node* Unpickler::NewStr(NK kind, std::string s) {
  Node* n = New(kind);
  n->s = std::move(s);
  return n;
}

Node* Unpickler::NewInt(NK kind, int64_t i) {
  Node* n = New(kind);
  n->i = i;
  return n;
}

Status Unpickler::CheckArena() const {
  if (arena_.size() > limits_.max_values)
    return Err("more than " + std::to_string(limits_.max_values) + " objects in the pickle");
  return Status::OK();
}

// ---------------------------------------------------------------- the input

Result<std::string_view> Unpickler::Take(uint64_t n) {
  if (n > data_.size() - pos_)
    return Err("needs " + std::to_string(n) + " bytes, " + std::to_string(data_.size() - pos_) +
               " left (truncated pickle)");
  std::string_view s = data_.substr(pos_, n);
  pos_ += n;
  return s;
}

Result<uint64_t> Unpickler::TakeUInt(int bytes) {
  PTC_ASSIGN_OR_RETURN(std::string_view s, Take(bytes));
  return ::ptc::internal::GetLittleEndian(s);
}

Result<std::string_view> Unpickler::Line() {
  const size_t nl = data_.find('\n', pos_);
  if (nl == std::string_view::npos) return Err("line without its newline (truncated pickle)");
  std::string_view s = data_.substr(pos_, nl - pos_);
  pos_ = nl + 1;
  return s;
}

Result<int64_t> Unpickler::ParseDecimal(std::string_view s) {
  if (!s.empty() && s.back() == 'L') s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec == std::errc::result_out_of_range)
    return Err("integer " + std::string(s.substr(0, 40)) + " exceeds 64 bits");
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || s.empty())
    return Err(QuotedExcerpt(s) + " is not a decimal integer");
  return v;
}

// ---------------------------------------------------------------- the stack and the memo

size_t Unpickler::Available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }

Result<Node*> Unpickler::Pop() {
  if (Available() == 0) return Err(marks_.empty() ? "stack underflow" : "stack underflow (below the MARK)");
  Node* n = stack_.back();
  stack_.pop_back();
  return n;
}

Result<Node*> Unpickler::Top() {
  if (Available() == 0) return Err(marks_.empty() ? "stack underflow" : "stack underflow (below the MARK)");
  return stack_.back();
}

Result<std::vector<Node*>> Unpickler::PopMark() {
  if (marks_.empty()) return Err("no MARK before it");
  std::vector<Node*> items(stack_.begin() + static_cast<ptrdiff_t>(marks_.back()), stack_.end());
  stack_.resize(marks_.back());
  marks_.pop_back();
  return items;
}

void Unpickler::Push(Node* n) { stack_.push_back(n); }

Status Unpickler::Put(uint64_t index) {
  PTC_ASSIGN_OR_RETURN(Node * top, Top());
  memo_[index] = top;
  return Status::OK();
}

Status Unpickler::Get(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end()) return Err("memo index " + std::to_string(index) + " was never stored");
  Push(it->second);
  return Status::OK();
}

std::string Unpickler::NodeKindName(const Node* n) {
  if (n->kind == NK::kStorage) return "torch storage";
  if (n->kind == NK::kObject) return n->global.FullName() + " object";
  if (n->kind == NK::kGlobal) return "global " + n->global.FullName();
  return std::string(KindName(static_cast<Kind>(n->kind)));
}

}  // namespace internal

Result<Value> Unpickle(std::string_view data, const std::string& what, const UnpickleLimits& limits) {
  return internal::Unpickler(data, what, limits).Run();
}

}  // namespace ptc::pickle
