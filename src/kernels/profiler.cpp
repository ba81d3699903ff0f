#include "kernels/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

namespace deepinfer::kernels {

namespace {
thread_local Profiler* t_profiler = nullptr;

// True when `tag` is `scope` or lies inside it.
bool within(std::string_view tag, std::string_view scope) {
  return tag.substr(0, scope.size()) == scope &&
         (tag.size() == scope.size() || tag[scope.size()] == '.');
}

std::string_view top_part(std::string_view tag) { return tag.substr(0, tag.find('.')); }
}  // namespace

Profiler* active_profiler() { return t_profiler; }
ScopedProfiler::ScopedProfiler(Profiler* p) : saved_(t_profiler) { t_profiler = p; }
ScopedProfiler::~ScopedProfiler() { t_profiler = saved_; }

void Profiler::on_kernel(std::string_view op, std::string_view tag, double seconds,
                         double pool_wait, const KernelWork& work) {
  OpStat& s = kernels_[{std::string(tag), std::string(op)}];
  ++s.calls;
  s.seconds += seconds;
  s.pool_wait += pool_wait;
  s.weight_bytes += work.weight_bytes;
  s.flops += work.flops;
  const double peak = work.fp8 ? limits_.fp8_peak_gflops : limits_.peak_gflops;
  if (limits_.read_gbps > 0 && peak > 0)  // one call's roofline: it reads and computes at once
    s.floor += std::max(work.weight_bytes / (limits_.read_gbps * 1e9), work.flops / (peak * 1e9));
}

void Profiler::on_scope(std::string_view tag, ScopeKind kind, double seconds) {
  ScopeStat& s = scopes_[std::string(tag)];
  s.kind = kind;
  ++s.entries;
  s.seconds += seconds;
}

void Profiler::reset() {
  kernels_.clear();
  scopes_.clear();
}

std::string Profiler::table(int64_t steps, double total_seconds) const {
  const double per = 1e3 / double(std::max<int64_t>(steps, 1));  // seconds -> ms per step
  const double total_ms = total_seconds * per;
  auto pct = [&](double ms) { return total_ms > 0 ? 100.0 * ms / total_ms : 0.0; };
  std::string out =
      fmt::format("# decode profile: {} steps, {:.3f} ms per step\n", steps, total_ms);

  // Per op, summed over the parts that call it, slowest first.
  std::map<std::string, OpStat> ops;
  for (const auto& [key, s] : kernels_) {
    ops[key.second] += s;
  }
  std::vector<std::pair<std::string, OpStat>> by_time(ops.begin(), ops.end());
  std::sort(by_time.begin(), by_time.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const bool floors = limits_.read_gbps > 0 && limits_.peak_gflops > 0;
  out += fmt::format("# {:<22} {:>9} {:>10} {:>10} {:>10} {:>7}{}\n", "op", "calls", "ms",
                     "compute", "pool wait", "% step",
                     floors ? fmt::format(" {:>10} {:>8}", "floor", "x floor") : "");
  double kernel_ms = 0, floor_ms = 0, floored_ms = 0;
  for (const auto& [op, s] : by_time) {
    const double ms = s.seconds * per;
    kernel_ms += ms;
    std::string fl;
    if (floors && s.floor > 0) {
      fl = fmt::format(" {:>10.3f} {:>8.2f}", s.floor * per, s.seconds / s.floor);
      floor_ms += s.floor * per;
      floored_ms += ms;
    }
    out += fmt::format("# {:<22} {:>9.1f} {:>10.3f} {:>10.3f} {:>10.3f} {:>7.1f}{}\n", op,
                       double(s.calls) / double(std::max<int64_t>(steps, 1)), ms,
                       (s.seconds - s.pool_wait) * per, s.pool_wait * per, pct(ms), fl);
  }
  out += fmt::format("# {:<22} {:>9} {:>10.3f} {:>10} {:>10} {:>7.1f}\n", "all kernels", "",
                     kernel_ms, "", "", pct(kernel_ms));
  if (floors)
    out += fmt::format(
        "# floor: each GEMM call at the slower of reading its weights at {:.1f} GB/s and its flops "
        "at {:.0f} GFLOP/s (fp8: {:.0f}); the GEMMs take {:.3f} ms against {:.3f} ms ({:.2f}x), "
        "the step {:.2f}x the floors\n",
        limits_.read_gbps, limits_.peak_gflops, limits_.fp8_peak_gflops, floored_ms, floor_ms,
        floor_ms > 0 ? floored_ms / floor_ms : 0.0, floor_ms > 0 ? total_ms / floor_ms : 0.0);
  if (floors) {
    // The GEMMs by place (the tag without its layer number: every layer's attention together),
    // most time over the floor first: where a faster kernel would pay.
    std::map<std::pair<std::string, std::string>, OpStat> places;
    for (const auto& [key, s] : kernels_) {
      if (s.floor <= 0) continue;
      std::string place = key.first;
      if (place.rfind("layer", 0) == 0) {
        const size_t dot = place.find('.');
        place = dot == std::string::npos ? "layer" : "layer*" + place.substr(dot);
      }
      places[{place.empty() ? "(no scope)" : place, key.second}] += s;
    }
    std::vector<std::pair<std::string, OpStat>> by_loss;
    for (const auto& [key, s] : places) by_loss.push_back({key.first + " " + key.second, s});
    std::sort(by_loss.begin(), by_loss.end(), [](const auto& a, const auto& b) {
      return a.second.seconds - a.second.floor > b.second.seconds - b.second.floor;
    });
    out += fmt::format("# {:<36} {:>7} {:>10} {:>10} {:>8} {:>10}\n", "GEMMs by place", "calls",
                       "ms", "floor", "x floor", "over");
    for (const auto& [name, s] : by_loss)
      out += fmt::format("# {:<36} {:>7.1f} {:>10.3f} {:>10.3f} {:>8.2f} {:>10.3f}\n", name,
                         double(s.calls) / double(std::max<int64_t>(steps, 1)), s.seconds * per,
                         s.floor * per, s.seconds / s.floor, (s.seconds - s.floor) * per);
  }

  // Per top-level part, in the order the forward runs them (layers numerically).
  std::vector<std::string> parts;
  for (const auto& [tag, s] : scopes_)
    if (tag.find('.') == std::string::npos) parts.push_back(tag);
  auto layer_no = [](const std::string& p) {
    return p.rfind("layer", 0) == 0 ? std::atoi(p.c_str() + 5) : -1;
  };
  auto rank = [&](const std::string& p) {
    if (p == "embed") return -2;
    if (layer_no(p) >= 0 && p.size() > 5 && std::isdigit(static_cast<unsigned char>(p[5])))
      return layer_no(p);
    return 1 << 20;
  };
  std::stable_sort(parts.begin(), parts.end(), [&](const std::string& a, const std::string& b) {
    return rank(a) != rank(b) ? rank(a) < rank(b) : a < b;
  });
  out += fmt::format("# {:<22} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7}\n", "part", "ms", "compute",
                     "pool wait", "collective", "other", "% step");
  double parts_ms = 0;
  auto row = [&](const std::string& name, double incl, double kern, double wait, double coll) {
    out += fmt::format("# {:<22} {:>9.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>7.1f}\n", name,
                       incl * per, (kern - wait) * per, wait * per, coll * per,
                       (incl - kern - coll) * per, pct(incl * per));
  };
  for (const std::string& part : parts) {
    const double incl = scopes_.at(part).seconds;
    double kern = 0, wait = 0, coll = 0;
    for (const auto& [key, s] : kernels_)
      if (within(key.first, part)) {
        kern += s.seconds;
        wait += s.pool_wait;
      }
    for (const auto& [tag, s] : scopes_) {
      if (s.kind != ScopeKind::collective || !within(tag, part)) continue;
      double inside = 0;
      for (const auto& [key, k] : kernels_)
        if (within(key.first, tag)) inside += k.seconds;
      coll += s.seconds - inside;
    }
    parts_ms += incl * per;
    row(part, incl, kern, wait, coll);
  }
  // Kernels called outside every scope count as their own part.
  double loose = 0, loose_wait = 0;
  for (const auto& [key, s] : kernels_)
    if (key.first.empty() || !scopes_.count(std::string(top_part(key.first)))) {
      loose += s.seconds;
      loose_wait += s.pool_wait;
    }
  if (loose > 0) {
    parts_ms += loose * per;
    row("(no scope)", loose, loose, loose_wait, 0);
  }
  out += fmt::format("# {:<22} {:>9.3f} {:>54} {:>7.1f}\n", "outside the parts",
                     total_ms - parts_ms, "(scheduling, bookkeeping)", pct(total_ms - parts_ms));
  return out;
}

}  // namespace deepinfer::kernels
