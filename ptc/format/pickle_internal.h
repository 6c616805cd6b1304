// Internal to the pickle files: what the unpickler (unpickle*.cc), the pickler
// (pickle_write.cc) and the value tree (pickle.cc) share: the opcodes and the
// text codecs (pickle_text.cc). Not part of the public interface
// (ptc/format/pickle.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ptc::pickle::internal {

// ---------------------------------------------------------------- opcodes

enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

// ---------------------------------------------------------------- text

// Appends code point `cp` (at most 0x10FFFF) to `out` as UTF-8; surrogates are
// encoded like any other code point, as Python's "surrogatepass" does.
void AppendUtf8(std::string& out, uint32_t cp);

// Latin-1 bytes as UTF-8 text: each byte is the code point of the same value.
std::string Latin1ToUtf8(std::string_view bytes);

// The inverse of Latin1ToUtf8: UTF-8 text (as IsUtf8 accepts) of code points
// < 256 back to bytes in *out; false when the text holds another code point.
bool Utf8ToLatin1(std::string_view text, std::string* out);

// Whether `s` is UTF-8 as Python's "surrogatepass" decoder accepts it (lone
// surrogates allowed; overlong forms and code points over 0x10FFFF not).
bool IsUtf8(std::string_view s);

// Python's raw-unicode-escape, the text of protocol 0's UNICODE opcode, as
// UTF-8 in *out: \uXXXX and \UXXXXXXXX are code points, every other byte is
// latin-1. False on a truncated or invalid escape.
bool RawUnicodeEscapeToUtf8(std::string_view s, std::string* out);

}  // namespace ptc::pickle::internal
