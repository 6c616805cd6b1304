#include "ptc/base/status.h"

#include <cerrno>
#include <cstring>

namespace ptc {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kNotFound:
      return "NotFound";
    case Code::kCorruption:
      return "Corruption";
    case Code::kIOError:
      return "IOError";
    case Code::kFailedPrecondition:
      return "FailedPrecondition";
    case Code::kAlreadyExists:
      return "AlreadyExists";
    case Code::kPermissionDenied:
      return "PermissionDenied";
    case Code::kUnimplemented:
      return "Unimplemented";
    case Code::kInternal:
      return "Internal";
  }
  return "Unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code())) + ": " + message();
}

Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  Status out(code(), std::string(context) + ": " + message());
  if (os_errno() != 0) out.rep_ = std::make_shared<const Rep>(Rep{code(), out.message(), os_errno()});
  return out;
}

Status InvalidArgumentError(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
Status NotFoundError(std::string m) { return Status(Code::kNotFound, std::move(m)); }
Status CorruptionError(std::string m) { return Status(Code::kCorruption, std::move(m)); }
Status IOError(std::string m) { return Status(Code::kIOError, std::move(m)); }
Status FailedPreconditionError(std::string m) { return Status(Code::kFailedPrecondition, std::move(m)); }
Status AlreadyExistsError(std::string m) { return Status(Code::kAlreadyExists, std::move(m)); }
Status InternalError(std::string m) { return Status(Code::kInternal, std::move(m)); }

Status ErrnoError(std::string_view what, int err) {
  Code code = err == ENOENT ? Code::kNotFound : err == EEXIST ? Code::kAlreadyExists : Code::kIOError;
  Status s;
  s.rep_ = std::make_shared<const Status::Rep>(Status::Rep{code, std::string(what) + ": " + std::strerror(err), err});
  return s;
}

std::string Abbreviate(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return std::string(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      static constexpr char kDigits[] = "0123456789abcdef";
      out += "\\x";
      out += kDigits[u >> 4];
      out += kDigits[u & 15];
    }
  }
  return out;
}

}  // namespace ptc
