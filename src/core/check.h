// DI_CHECK (an internal assertion: a failure is a bug, thrown as InternalError naming the condition
// and the source line) and DI_FAIL (a user's mistake, thrown as Error with a message that says
// what to do). Checks stay on in release builds (docs/architecture.md §8). Internal: the public
// headers include only <deepinfer/...> and the standard library.
#pragma once

#include <deepinfer/error.h>
#include <fmt/format.h>

#include <string>

namespace deepinfer::detail {
[[noreturn]] inline void check_failed(const char* cond, const char* file, int line,
                                      const std::string& msg) {
  throw InternalError(fmt::format("{} (check `{}` failed at {}:{})", msg, cond, file, line));
}
}  // namespace deepinfer::detail

// Usage: DI_CHECK(n > 0, "n must be positive, got {}", n)
#define DI_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::deepinfer::detail::check_failed(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define DI_FAIL(...) throw ::deepinfer::Error(fmt::format(__VA_ARGS__))
