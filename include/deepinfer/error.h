// Errors: one exception type a user can catch, with messages that name the problem and the fix.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace deepinfer {

// Every error the engine raises. The message says what is wrong and what to do about it.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective missed its deadline (DEEPINFER_COMM_TIMEOUT_S): a peer hung or died.
class CommTimeout : public Error {
 public:
  using Error::Error;
};

// A DI_CHECK failed: an internal assertion, i.e. a bug, not a user's mistake. Its message names
// the condition and the source line. Errors a user can fix are thrown with DI_FAIL instead, and
// say what is wrong and what to do without pointing into the source.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void check_failed(const char* cond, const char* file, int line,
                                      const std::string& msg) {
  throw InternalError(fmt::format("{} (check `{}` failed at {}:{})", msg, cond, file, line));
}
}  // namespace detail

}  // namespace deepinfer

// Checks stay on in release builds (docs/architecture.md §8). Usage: DI_CHECK(n > 0, "n must be positive, got {}", n)
#define DI_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::deepinfer::detail::check_failed(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define DI_FAIL(...) throw ::deepinfer::Error(fmt::format(__VA_ARGS__))
