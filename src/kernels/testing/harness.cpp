#include "kernels/testing/harness.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <set>

#include "core/check.h"
#include "core/element.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels::testing {

namespace {
struct CaseSource {
  const char* name;
  void (*fn)(std::vector<OpCase>&);
};
std::vector<CaseSource>& case_sources() {
  static std::vector<CaseSource> s;
  return s;
}

bool same_bits(DType t, const void* a, const void* b, int64_t i) {
  const size_t w = dtype_size(t);
  return std::memcmp(static_cast<const char*>(a) + size_t(i) * w,
                     static_cast<const char*>(b) + size_t(i) * w, w) == 0;
}
}  // namespace

void poison(DType dtype, void* data, int64_t numel) {
  if (numel <= 0) return;
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(data);
      for (int64_t i = 0; i < numel; ++i) p[i] = NAN;
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(data);
      for (int64_t i = 0; i < numel; ++i) p[i] = NAN;
      return;
    }
    default:  // bf16 0xFFFF and e4m3/e5m2 0xFF are NaN; integers become -1 / max
      std::memset(data, 0xff, size_t(numel) * dtype_size(dtype));
      return;
  }
}

CaseResult compare_buffers(const char* name, DType dtype, const void* a, const void* b,
                           int64_t numel, const Tolerance& tol) {
  CaseResult r;
  if (!dtype_is_float(dtype)) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < numel; ++i)
      if (!same_bits(dtype, a, b, i)) {
        if (first < 0) first = i;
        ++bad;
      }
    const double frac = numel ? double(bad) / double(numel) : 0.0;
    r.max_rel_err = frac;
    if (bad > 0 && frac > tol.int_mismatch_frac) {
      r.pass = false;
      r.detail = fmt::format(
          "{}: {} of {} elements differ (allowed fraction {}), first at [{}]: {} vs host {}", name,
          bad, numel, tol.int_mismatch_frac, first, load_as_double(dtype, a, first),
          load_as_double(dtype, b, first));
    }
    return r;
  }
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const double x = load_as_double(dtype, a, i), y = load_as_double(dtype, b, i);
    if (std::isnan(x) || std::isnan(y)) {
      r.pass = false;
      r.detail = fmt::format("{}: NaN at [{}] ({} vs host {}): unwritten (poisoned) or invalid",
                             name, i, x, y);
      return r;
    }
    if (std::isinf(x) || std::isinf(y)) {
      if (x == y) continue;
      r.pass = false;
      r.detail = fmt::format("{}: infinity mismatch at [{}]: {} vs host {}", name, i, x, y);
      return r;
    }
    diff2 += (x - y) * (x - y);
    ref2 += y * y;
  }
  const double diff = std::sqrt(diff2), ref = std::sqrt(ref2);
  if (ref == 0) {
    r.max_rel_err = diff;
    if (diff != 0) {
      r.pass = false;
      r.detail = fmt::format("{}: host output is all zero but ‖a−b‖ = {:.3e}", name, diff);
    }
    return r;
  }
  r.max_rel_err = diff / ref;
  if (!(r.max_rel_err <= tol.rel_l2)) {
    // Name the worst element to make the failure actionable.
    int64_t worst = 0;
    double wd = -1;
    for (int64_t i = 0; i < numel; ++i) {
      const double d = std::fabs(load_as_double(dtype, a, i) - load_as_double(dtype, b, i));
      if (d > wd) wd = d, worst = i;
    }
    r.pass = false;
    r.detail = fmt::format("{}: ‖a−b‖/‖b‖ = {:.3e} > tolerance {:.1e}; worst [{}]: {} vs host {}",
                           name, r.max_rel_err, tol.rel_l2, worst, load_as_double(dtype, a, worst),
                           load_as_double(dtype, b, worst));
  }
  return r;
}

namespace detail {

CaseResult compare_backends_impl(const std::vector<BufferSlot>& slots,
                                 const std::function<void(KernelBackend)>& run,
                                 const Tolerance& tol) {
  // Keep in-place buffers' inputs so both backends start from the same values.
  std::vector<std::vector<char>> saved(slots.size()), host_out(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& s = slots[i];
    const size_t bytes = size_t(s.numel) * dtype_size(s.dtype);
    if (s.role == BufferRole::inout)
      saved[i].assign(static_cast<char*>(s.ptr), static_cast<char*>(s.ptr) + bytes);
  }
  auto prepare = [&] {
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto& s = slots[i];
      if (s.role == BufferRole::out) poison(s.dtype, s.ptr, s.numel);
      if (s.role == BufferRole::inout && !saved[i].empty())
        std::memcpy(s.ptr, saved[i].data(), saved[i].size());
    }
  };
  prepare();
  run(KernelBackend::host);
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& s = slots[i];
    if (s.role == BufferRole::in) continue;
    host_out[i].assign(static_cast<char*>(s.ptr),
                       static_cast<char*>(s.ptr) + size_t(s.numel) * dtype_size(s.dtype));
  }
  prepare();
  run(KernelBackend::cpu);
  CaseResult total;
  int outputs = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& s = slots[i];
    if (s.role == BufferRole::in) continue;
    ++outputs;
    CaseResult r = compare_buffers(s.name, s.dtype, s.ptr, host_out[i].data(), s.numel, tol);
    total.max_rel_err = std::max(total.max_rel_err, r.max_rel_err);
    if (!r.pass) {
      total.pass = false;
      if (!total.detail.empty()) total.detail += "; ";
      total.detail += r.detail;
    }
  }
  if (outputs == 0) {
    total.pass = false;
    total.detail = "the op lists no outputs in its OpSpec: nothing was compared";
  }
  return total;
}

}  // namespace detail

bool register_op_cases(const char* source, void (*fn)(std::vector<OpCase>&)) {
  case_sources().push_back({source, fn});
  return true;
}

std::vector<OpCase> all_op_cases() {
  std::vector<OpCase> cases;
  for (const auto& s : case_sources()) s.fn(cases);
  return cases;
}

HarnessSummary run_harness(const HarnessOptions& opt) {
  HarnessSummary sum;
  std::set<std::string> ops;
  bool any_op = false;
  for (const auto& c : all_op_cases()) {
    if (!opt.op.empty() && c.op != opt.op) continue;
    any_op = true;
    if (opt.quick && !c.quick) continue;
    ops.insert(c.op);
    CaseResult r;
    try {
      reset_call_counters();
      r = c.run();
    } catch (const std::exception& e) {
      r.pass = false;
      r.detail = fmt::format("exception: {}", e.what());
    }
    if (r.pass) {
      ++sum.passed;
      if (opt.verbose)
        fmt::print(opt.out, "PASS {} [{}] rel_err {:.2e}\n", c.op, c.name, r.max_rel_err);
    } else {
      ++sum.failed;
      fmt::print(opt.out, "FAIL {} [{}]: {}\n", c.op, c.name, r.detail);
    }
    std::fflush(opt.out);
  }
  if (!opt.op.empty() && !any_op) {
    std::set<std::string> known;
    for (const auto& c : all_op_cases()) known.insert(c.op);
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    fmt::print(opt.out, "no kernel cases for op '{}' (known ops: {})\n", opt.op, list);
    ++sum.failed;
  }
  sum.ops.assign(ops.begin(), ops.end());
  fmt::print(opt.out, "kernels: {} passed, {} failed\n", sum.passed, sum.failed);
  std::fflush(opt.out);
  return sum;
}

}  // namespace deepinfer::kernels::testing
