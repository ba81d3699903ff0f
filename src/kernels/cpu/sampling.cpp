// cpu: sampling. Highway SIMD for the max / arg-max and the temperature divide; partial
// selection (nth_element) instead of full sorts; rows over kernel_pool(). Follows the rule in
// sampling.h operation for operation, so tokens equal host's bit for bit.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/sampling.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include "kernels/sampling.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] = l[i] / temperature (temperature 0: copy); returns max(out). Checks for NaN.
float scale_and_max(const float* l, int64_t n, float temperature, float* out, int64_t row) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  auto vmax = hn::Set(df, -HUGE_VALF);
  auto nan = hn::Zero(df);
  const auto vt = hn::Set(df, temperature);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    auto v = hn::LoadU(df, l + i);
    nan = hn::Or(nan, hn::VecFromMask(df, hn::IsNaN(v)));
    if (out) {
      v = hn::Div(v, vt);
      hn::StoreU(v, df, out + i);
    }
    vmax = hn::Max(vmax, v);
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  bool any_nan = !hn::AllFalse(df, hn::MaskFromVec(nan));
  for (; i < n; ++i) {
    const float v = out ? (out[i] = l[i] / temperature) : l[i];
    any_nan |= std::isnan(v);
    m = std::max(m, v);
  }
  DI_CHECK(!any_nan, "sample: row {} has a NaN logit", row);
  return m;
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(scale_and_max);

namespace {

int32_t sample_row(const SamplingParams& p, int64_t b, std::vector<float>& x,
                   std::vector<double>& e, std::vector<int64_t>& ids) {
  const int64_t V = p.vocab;
  const float* l = p.logits + b * p.stride();
  const float temperature = p.temperature ? p.temperature[b] : 0.0f;
  const int32_t top_k = p.top_k ? p.top_k[b] : 0;
  const float top_p = p.top_p ? p.top_p[b] : 1.0f;
  if (temperature <= 0.0f || top_k == 1) {
    const float m = HWY_DYNAMIC_DISPATCH(scale_and_max)(l, V, 1.0f, nullptr, b);
    for (int64_t i = 0; i < V; ++i)
      if (l[i] == m) return int32_t(i);  // the first maximum: ties -> lower id
    DI_FAIL("sample: row {} has no maximum logit", b);
  }
  const float m = HWY_DYNAMIC_DISPATCH(scale_and_max)(l, V, temperature, x.data(), b);
  DI_CHECK(std::isfinite(m), "sample: row {} has no finite logit to sample from (max {})", b, m);
  // (value descending, id ascending): a strict total order, so every selection is unique.
  auto before = [&](int64_t a, int64_t c) {
    return x[size_t(a)] > x[size_t(c)] || (x[size_t(a)] == x[size_t(c)] && a < c);
  };
  auto exp_of = [&](int64_t i) { return std::exp(double(x[size_t(i)]) - double(m)); };
  const bool has_k = top_k > 0 && top_k < V;
  // ids: the candidates in id order (then the kept ones).
  ids.resize(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  int64_t n_cand = V;
  if (has_k) {
    std::nth_element(ids.begin(), ids.begin() + top_k, ids.end(), before);
    n_cand = top_k;
    ids.resize(static_cast<size_t>(n_cand));
    std::sort(ids.begin(), ids.end());
  }
  double total = 0.0;
  for (int64_t j = 0; j < n_cand; ++j)
    total += (e[size_t(ids[size_t(j)])] = exp_of(ids[size_t(j)]));
  // kept: ids (id order) that survive top-p.
  if (top_p < 1.0f) {
    const double target = double(top_p) * total;
    std::vector<int64_t> order(ids);
    int64_t prefix = -1;
    for (int64_t want = std::min<int64_t>(64, n_cand);; want = std::min(n_cand, want * 8)) {
      std::partial_sort(order.begin(), order.begin() + want, order.end(), before);
      double cum = 0.0;
      for (int64_t j = 0; j < want; ++j) {
        cum += e[size_t(order[size_t(j)])];
        if (cum >= target) {
          prefix = j + 1;
          break;
        }
      }
      if (prefix > 0 || want == n_cand) break;
    }
    if (prefix < 0) prefix = n_cand;
    order.resize(static_cast<size_t>(prefix));
    std::sort(order.begin(), order.end());
    ids.swap(order);
  }
  double kept_total = 0.0;
  for (int64_t id : ids) kept_total += e[size_t(id)];
  const double r =
      sampling_uniform(uint64_t(p.seed ? p.seed[b] : 0), uint64_t(p.counter ? p.counter[b] : 0)) *
      kept_total;
  double cum = 0.0;
  for (int64_t id : ids) {
    cum += e[size_t(id)];
    if (cum > r) return int32_t(id);
  }
  return int32_t(ids.back());
}

}  // namespace

void sample(const SamplingParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> x(static_cast<size_t>(p.vocab));
    std::vector<double> e(static_cast<size_t>(p.vocab));
    std::vector<int64_t> ids;
    for (int64_t b = b0; b < b1; ++b) p.tokens[b] = sample_row(p, b, x, e, ids);
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
