// Status and Result<T>: how every ptcfs library reports failure.
//
// No exceptions cross our library boundaries. A function that can fail returns
// Status (nothing else to return) or Result<T>. OK costs one null pointer, as
// in leveldb. Messages name the file, tensor or rule at fault; callers add
// context on the way up with the two macros at the bottom of this file.
//
// Thread safety: values; safe to copy and move between threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace ptc {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad input from the user: config, dims, schema, file content
  kNotFound,            // a file, tensor or rank that should exist does not
  kCorruption,          // stored data fails a checksum or its metadata is inconsistent
  kIOError,             // the operating system failed a call
  kFailedPrecondition,  // the store is not in a state that allows the operation
  kAlreadyExists,
  kPermissionDenied,  // the operation is not allowed on this object (a read-only file)
  kUnimplemented,
  kInternal,  // a broken invariant of ours
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message);

  static Status OK() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "InvalidArgument: <message>", or "OK".
  std::string ToString() const;

  // The errno of the OS call that failed (ErrnoError), else 0: what a file
  // system tells its caller when the cause is the caller's to act on (ENOSPC).
  int os_errno() const { return rep_ ? rep_->os_errno : 0; }

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  friend Status ErrnoError(std::string_view what, int err);
  struct Rep {
    Code code;
    std::string message;
    int os_errno = 0;
  };
  std::shared_ptr<const Rep> rep_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status CorruptionError(std::string message);
Status IOError(std::string message);
// "<what>: <strerror(err)>": NotFound for ENOENT, AlreadyExists for EEXIST,
// else IOError; os_errno() is `err`.
Status ErrnoError(std::string_view what, int err);
Status FailedPreconditionError(std::string message);
Status AlreadyExistsError(std::string message);
Status InternalError(std::string message);

// `text` for quoting an input in a message: whole when at most `max_bytes`,
// else its start and "... (N bytes)", cut on a UTF-8 character boundary.
std::string Abbreviate(std::string_view text, size_t max_bytes = 120);
// `text` safe to print on a terminal: every control byte (C0, DEL) written
// as Python writes it in a repr, "\n", "\r", "\t", "\x1b", so that an input
// (a file name, a key, an etcd member's address) can neither move the cursor
// nor forge an output line; a backslash stays itself; other bytes unchanged.
std::string Printable(std::string_view text);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(Code::kInternal, "Result constructed from OK status");
  }
  template <typename U,
            typename = std::enable_if_t<std::is_convertible_v<U&&, T> && !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, T>>>
  Result(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // REQUIRES: ok()
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline const Status& GetStatus(const Status& s) { return s; }
template <typename T>
Status GetStatus(const Result<T>& r) {
  return r.status();
}
inline Status AddContext(Status s) { return s; }
inline Status AddContext(Status s, std::string_view context) { return s.WithContext(context); }
}  // namespace internal

}  // namespace ptc

#define PTC_CONCAT_INNER_(a, b) a##b
#define PTC_CONCAT_(a, b) PTC_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or Result) is not OK,
// optionally prefixing the message with a context string.
#define PTC_RETURN_IF_ERROR(expr, ...)                                                                            \
  do {                                                                                                            \
    ::ptc::Status ptc_status_ = ::ptc::internal::GetStatus(expr);                                                 \
    if (!ptc_status_.ok()) return ::ptc::internal::AddContext(std::move(ptc_status_) __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// `lhs = value of expr` (a Result), or return its Status (with optional context).
#define PTC_ASSIGN_OR_RETURN(lhs, expr, ...) \
  PTC_ASSIGN_OR_RETURN_IMPL_(PTC_CONCAT_(ptc_result_, __LINE__), lhs, expr __VA_OPT__(, ) __VA_ARGS__)
#define PTC_ASSIGN_OR_RETURN_IMPL_(r, lhs, expr, ...)                                     \
  auto r = (expr);                                                                        \
  if (!r.ok()) return ::ptc::internal::AddContext(r.status() __VA_OPT__(, ) __VA_ARGS__); \
  lhs = std::move(r).value()
