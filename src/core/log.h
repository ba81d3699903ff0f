// Logging with a rank prefix: "[deepinfer r3/8] message". The rank is per thread, so
// `local` rank threads each print their own.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "core/check.h"

namespace deepinfer {

enum class LogLevel : uint8_t { debug, info, warn, error };

void set_log_rank(int rank, int world);  // for the calling thread
void log_message(LogLevel level, std::string_view msg);
bool log_enabled(LogLevel level);

template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::info))
    log_message(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::warn))
    log_message(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::debug))
    log_message(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_message(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deepinfer
