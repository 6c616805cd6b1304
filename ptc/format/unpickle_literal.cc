// The unpickler's opcodes that push a constant: None, bools, ints (BININT*,
// LONG*, protocol-0 INT and LONG), floats, text (str) and bytes.
#include <charconv>
#include <cstring>

#include "ptc/format/little_endian.h"
#include "ptc/format/unpickle_internal.h"

namespace ptc::pickle::internal {

Handled Unpickler::StepLiteral() {
  switch (op_) {
    case kNone:
      Push(New(NK::kNone));
      return Status::OK();
    case kNewTrue:
    case kNewFalse:
      Push(NewInt(NK::kBool, op_ == kNewTrue));
      return Status::OK();
    case kInt: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      if (line == "00" || line == "01") {  // protocol 0's False and True
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
        return Err(QuotedExcerpt(line) + " is not a float");
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
    case kBinUnicode:
      return PushText(NK::kStr, 4);
    case kShortBinUnicode:
      return PushText(NK::kStr, 1);
    case kBinUnicode8:
      return PushText(NK::kStr, 8);
    case kBinString: {
      PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(4));
      if (n > 0x7FFFFFFF) return Err("negative length");
      PTC_ASSIGN_OR_RETURN(std::string_view s, Take(n));
      Push(NewStr(NK::kBytes, std::string(s)));
      return Status::OK();
    }
    case kShortBinString:
      return PushText(NK::kBytes, 1);
    case kBinBytes:
      return PushText(NK::kBytes, 4);
    case kShortBinBytes:
      return PushText(NK::kBytes, 1);
    case kBinBytes8:
      return PushText(NK::kBytes, 8);
    case kByteArray8:
      return PushText(NK::kBytes, 8);
    case kUnicode: {
      PTC_ASSIGN_OR_RETURN(std::string_view line, Line());
      std::string text;
      if (!RawUnicodeEscapeToUtf8(line, &text)) return Err("malformed raw-unicode-escape text");
      Push(NewStr(NK::kStr, std::move(text)));
      return Status::OK();
    }
    default:
      return std::nullopt;
  }
}

Result<int64_t> Unpickler::DecodeLong(std::string_view bytes) {
  if (bytes.size() > 8) return Err("integer of " + std::to_string(bytes.size()) + " bytes exceeds 64 bits");
  if (bytes.empty()) return int64_t{0};
  uint64_t v = ::ptc::internal::GetLittleEndian(bytes);
  if (bytes.size() < 8 && (static_cast<unsigned char>(bytes.back()) & 0x80)) v |= ~uint64_t{0} << (8 * bytes.size());
  return static_cast<int64_t>(v);
}

Result<Node*> Unpickler::Text(NK kind, std::string_view bytes) {
  if (kind == NK::kStr && !IsUtf8(bytes)) return Err("text is not UTF-8");
  return NewStr(kind, std::string(bytes));
}

Status Unpickler::PushText(NK kind, int len_bytes) {
  PTC_ASSIGN_OR_RETURN(uint64_t n, TakeUInt(len_bytes));
  PTC_ASSIGN_OR_RETURN(std::string_view s, Take(n));
  PTC_ASSIGN_OR_RETURN(Node * node, Text(kind, s));
  Push(node);
  return Status::OK();
}

}  // namespace ptc::pickle::internal
