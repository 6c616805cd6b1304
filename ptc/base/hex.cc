#include "ptc/base/hex.h"

namespace ptc {
namespace {

constexpr char kDigits[] = "0123456789abcdef";

int Digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string Hex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> Unhex(std::string_view text, const std::string& what) {
  if (text.size() % 2 != 0) return InvalidArgumentError(what + ": odd hex length");
  std::string bytes(text.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int hi = Digit(text[2 * i]), lo = Digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgumentError(what + ": not hex at " + std::to_string(2 * i));
    bytes[i] = static_cast<char>(hi << 4 | lo);
  }
  return bytes;
}

}  // namespace ptc
