#pragma once
// Request and input errors as values. A Status carries a code that the server maps to an
// OpenAI error envelope and the CLI maps to an exit code, and a one-line message that
// names the file (or field) and the problem. No exception crosses a thread boundary.
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace moonrun {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad user input (HTTP 400, CLI exit 2)
  kNotFound,           // missing file / tensor / model (HTTP 404)
  kDataLoss,           // truncated or corrupt file
  kFailedPrecondition, // config or checkpoint inconsistent with what we can run
  kOutOfRange,         // e.g. prompt longer than the context
  kResourceExhausted,  // queue full, pool full (HTTP 503)
  kUnauthenticated,    // HTTP 401
  kUnimplemented,
  kInternal,           // a bug or a failed backend (HTTP 500)
  kUnavailable,        // shutting down / engine dead (HTTP 503)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

// Result<T>: a value or a non-ok Status (std::expected is C++23).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    MR_CHECK(!std::get<Status>(v_).is_ok()) << "Result constructed from an ok Status";
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    MR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(v_);
  }
  const T& value() const& {
    MR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(v_);
  }
  T&& value() && {
    MR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace moonrun

// Propagate a non-ok Status from an expression returning Status.
#define MR_RETURN_IF_ERROR(expr)               \
  do {                                         \
    ::moonrun::Status _mr_st = (expr);         \
    if (!_mr_st.is_ok()) return _mr_st;        \
  } while (0)

#define MR_CONCAT_INNER(a, b) a##b
#define MR_CONCAT(a, b) MR_CONCAT_INNER(a, b)
// auto x = MR_TRY(expr_returning_Result); -- GNU statement expression, g++/clang only.
#define MR_TRY(expr)                                              \
  ({                                                              \
    auto MR_CONCAT(_mr_r, __LINE__) = (expr);                     \
    if (!MR_CONCAT(_mr_r, __LINE__).is_ok())                      \
      return MR_CONCAT(_mr_r, __LINE__).status();                 \
    std::move(MR_CONCAT(_mr_r, __LINE__)).value();                \
  })
