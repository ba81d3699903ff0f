// Rank-prefixed logging to stderr; one fwrite per message so lines from rank threads never
// interleave.
#include "core/log.h"

#include <cstdio>
#include <mutex>
#include <string>

#include "core/check.h"
#include "core/env.h"

namespace deepinfer {
namespace {

thread_local int t_rank = -1;
thread_local int t_world = 0;
std::mutex g_log_mutex;

LogLevel parse_level(const std::string& s) {
  if (s == "debug") return LogLevel::debug;
  if (s == "warn") return LogLevel::warn;
  if (s == "error") return LogLevel::error;
  return LogLevel::info;
}

std::string_view level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug: ";
    case LogLevel::info:
      return "";
    case LogLevel::warn:
      return "warning: ";
    case LogLevel::error:
      return "error: ";
  }
  return "";
}

}  // namespace

void set_log_rank(int rank, int world) {
  t_rank = rank;
  t_world = world;
}

bool log_enabled(LogLevel level) {
  if (level == LogLevel::error) return true;
  return int(level) >= int(parse_level(knobs().log_level));
}

void log_message(LogLevel level, std::string_view msg) {
  std::string line = t_rank >= 0 ? fmt::format("[deepinfer r{}/{}] ", t_rank, t_world)
                                 : std::string("[deepinfer] ");
  line += level_tag(level);
  line += msg;
  if (line.empty() || line.back() != '\n') line += '\n';
  std::lock_guard lock(g_log_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace deepinfer
