#include "ptc/model/tensor_name.h"

#include <cstdio>
#include <string>

namespace ptc {

std::string EscapeName(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (name.size() > 80) out += "...";
  return out;
}

Status ValidateTensorName(std::string_view name, std::string_view where) {
  auto bad = [&](const std::string& rule) {
    return InvalidArgumentError(std::string(where) + ": tensor name '" + EscapeName(name) + "' " + rule);
  };
  if (name.empty()) return bad("is empty");
  if (name == "." || name == "..") return bad("is not allowed ('.' and '..' name directories)");
  if (name.size() > kMaxTensorNameBytes) {
    return bad("is " + std::to_string(name.size()) + " bytes long (at most " + std::to_string(kMaxTensorNameBytes) +
               ")");
  }
  for (const char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '/') return bad("contains '/' (a tensor name cannot name a directory)");
    if (c < 0x20 || c == 0x7f) return bad("contains a control character");
  }
  return Status::OK();
}

Status ValidateLeafName(std::string_view dir, std::string_view name) {
  auto bad = [&](const std::string& rule) {
    return InvalidArgumentError(std::string(dir) + ": refusing to create '" + EscapeName(name) + "' (" + rule + ")");
  };
  if (name.empty() || name == "." || name == "..") return bad("not a file name");
  if (name.find('/') != std::string_view::npos) return bad("contains '/'");
  if (name.find('\0') != std::string_view::npos) return bad("contains NUL");
  if (name.size() > 255) return bad("longer than 255 bytes");
  return Status::OK();
}

}  // namespace ptc
