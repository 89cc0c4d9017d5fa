// Status and Result<T>: errors are values in weir; no exception crosses a
// module boundary. A Status is cheap when OK (one enum, no allocation).
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace weir {

enum class Code : unsigned char {
  kOk = 0,
  kInvalidArgument,     // bad input from a caller; permanent
  kNotFound,            // the named thing does not exist; permanent
  kAlreadyExists,       // create of something that exists; permanent
  kPreconditionFailed,  // a condition (create-only, CAS, match_seq_num) did not hold
  kOutOfRange,          // a position past the end (a byte range, an offset)
  kCorruption,          // stored bytes fail verification; permanent, data-loss class
  kTimeout,             // the operation did not finish in time; retryable, outcome unknown
  kUnavailable,         // transient failure (network, 5xx, busy); retryable
  kResourceExhausted,   // a budget or limit is full; retryable after backoff
  kFenced,              // a newer epoch owns this work; this writer must stop
  kCancelled,           // shut down before completion
  kIOError,             // local I/O failed (disk, permissions)
  kNotSupported,        // valid request this build or backend cannot do
  kInternal,            // a bug: an invariant did not hold
  kQuotaExhausted,      // a configured count (streams, basins) is reached; holds until something is deleted
};

std::string_view CodeName(Code code);

// Whether a caller may retry the same operation and expect it to succeed.
constexpr bool IsRetryableCode(Code c) {
  return c == Code::kTimeout || c == Code::kUnavailable || c == Code::kResourceExhausted;
}

// An error or OK, as a value: copied freely, on any thread (copies share
// one immutable message). OK costs no allocation; built with kOk it is OK
// and keeps no message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message)
      : rep_(code == Code::kOk ? nullptr : std::make_shared<Rep>(Rep{code, std::move(message)})) {}

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& message() const;
  bool retryable() const { return IsRetryableCode(code()); }

  // "NotFound: object wal/a/1 does not exist"
  std::string ToString() const;

  // Returns a copy with `context: ` prefixed to the message.
  Status WithContext(std::string_view context) const;

  void IgnoreError() const {}

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

template <typename... Args>
Status MakeStatus(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define WEIR_STATUS_HELPER(Name)                                             \
  template <typename... Args>                                                \
  Status Name(fmt::format_string<Args...> f, Args&&... args) {               \
    return Status(Code::k##Name, fmt::format(f, std::forward<Args>(args)...)); \
  }
WEIR_STATUS_HELPER(InvalidArgument)
WEIR_STATUS_HELPER(NotFound)
WEIR_STATUS_HELPER(AlreadyExists)
WEIR_STATUS_HELPER(PreconditionFailed)
WEIR_STATUS_HELPER(OutOfRange)
WEIR_STATUS_HELPER(Corruption)
WEIR_STATUS_HELPER(Timeout)
WEIR_STATUS_HELPER(Unavailable)
WEIR_STATUS_HELPER(ResourceExhausted)
WEIR_STATUS_HELPER(QuotaExhausted)
WEIR_STATUS_HELPER(Fenced)
WEIR_STATUS_HELPER(Cancelled)
WEIR_STATUS_HELPER(IOError)
WEIR_STATUS_HELPER(NotSupported)
WEIR_STATUS_HELPER(Internal)
#undef WEIR_STATUS_HELPER

// Result<T>: a T or a non-OK Status, as a value (its owner's; not
// synchronized). Built from an OK Status it asserts, or in a release build
// holds kInternal. value(), * and -> need ok(): on an error they throw
// std::bad_variant_access.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is meaningless");

 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK Status");
    if (std::get<Status>(v_).ok()) v_ = Status(Code::kInternal, "Result built from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace weir

#define WEIR_CONCAT_INNER(a, b) a##b
#define WEIR_CONCAT(a, b) WEIR_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
// (The temporary is named per line: a lambda inside `expr` may use it too.)
#define WEIR_RETURN_IF_ERROR(expr) WEIR_RETURN_IF_ERROR_IMPL(WEIR_CONCAT(_weir_st_, __LINE__), expr)
#define WEIR_RETURN_IF_ERROR_IMPL(tmp, expr) \
  do {                                       \
    ::weir::Status tmp = (expr);             \
    if (!tmp.ok()) return tmp;               \
  } while (0)

// WEIR_ASSIGN_OR_RETURN(auto x, Foo()); declares x from a Result or returns its Status.
#define WEIR_ASSIGN_OR_RETURN(lhs, expr) \
  WEIR_ASSIGN_OR_RETURN_IMPL(WEIR_CONCAT(_weir_res_, __LINE__), lhs, expr)
#define WEIR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
