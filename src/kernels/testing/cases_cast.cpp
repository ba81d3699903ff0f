// Harness cases (cpu vs host) for the casts of kernels/cast.h: both run the same row bodies in a
// different thread split, so the bytes must match exactly (tests/kernels/test_cast_host.cpp checks
// the rows themselves against the rules).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "kernels/cast.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

constexpr Tolerance kExact{.rel_l2 = 0, .int_mismatch_frac = 0};

// bf16 values over many binades (so scales differ per block).
std::vector<bf16> spread_bf16(int64_t n, uint64_t seed) {
  std::vector<bf16> x = random_bf16(n, seed, -3.0f, 3.0f);
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = f32_to_bf16(bf16_to_f32(x[size_t(i)]) *
                               std::ldexp(1.0f, int(hash64(seed + 1, uint64_t(i / 32)) % 8) - 4));
  return x;
}

CaseResult run_e2m1(int64_t m, int64_t k, bool back, uint64_t seed) {
  const auto x = spread_bf16(m * k, seed);
  std::vector<uint8_t> q(buffer_size(m * k / 2)), sf(buffer_size(m * k / 32));
  if (!back)
    return compare_backends(
        cast_e2m1, CastE2m1Params{.x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k},
        kExact);
  host::cast_e2m1({.x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k});
  std::vector<bf16> out(buffer_size(m * k));
  std::vector<float> out_f32(out.size());
  return compare_backends(cast_back_e2m1,
                          CastBackE2m1Params{.q = q.data(),
                                             .sf = sf.data(),
                                             .out = out.data(),
                                             .out_f32 = out_f32.data(),
                                             .m = m,
                                             .k = k},
                          kExact);
}

CaseResult run_e5m6(int64_t m, int64_t k, bool round_sf, bool back, uint64_t seed) {
  const auto x = spread_bf16(m * k, seed);
  std::vector<uint8_t> q(buffer_size(m * k * 3 / 2));
  std::vector<float> sf(buffer_size(m));
  const CastE5m6Params p{
      .x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k, .round_sf = round_sf};
  if (!back) return compare_backends(cast_e5m6, p, kExact);
  host::cast_e5m6(p);
  std::vector<bf16> out(buffer_size(m * k));
  std::vector<float> out_f32(out.size());
  return compare_backends(cast_back_e5m6,
                          CastBackE5m6Params{.q = q.data(),
                                             .sf = sf.data(),
                                             .out = out.data(),
                                             .out_f32 = out_f32.data(),
                                             .m = m,
                                             .k = k},
                          kExact);
}

CaseResult run_lossless(int64_t m, int64_t k, int64_t block, uint64_t seed) {
  const auto x = spread_bf16(m * k, seed);  // per-32 spread 2^-4..2^3: fits 2^6 of headroom
  std::vector<uint8_t> q(buffer_size(m * k / 2)), sf(buffer_size(m * k / 32));
  host::cast_e2m1({.x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k});
  std::vector<fp8_e4m3> out(buffer_size(m * k));
  std::vector<float> osf(buffer_size(m * k / block));
  return compare_backends(cast_e2m1_to_e4m3,
                          CastE2m1ToE4m3Params{.q = q.data(),
                                               .sf = sf.data(),
                                               .out = out.data(),
                                               .out_sf = osf.data(),
                                               .m = m,
                                               .k = k,
                                               .block = block},
                          kExact);
}

CaseResult run_per_channel(int64_t t, int64_t h, bool gather, bool round_sf, uint64_t seed) {
  const auto x = spread_bf16(t * h, seed);
  std::vector<int32_t> pos;
  if (gather)
    for (int64_t r = 0; r < 3 * t / 2; ++r)
      pos.push_back(r % 11 == 3 ? -1 : int32_t(hash64(seed + 2, uint64_t(r)) % uint64_t(t)));
  const int64_t rows = gather ? int64_t(pos.size()) : t;
  std::vector<fp8_e4m3> q(buffer_size(rows * h));
  std::vector<float> sf(buffer_size((rows + 127) / 128 * h));
  return compare_backends(per_channel_cast,
                          PerChannelCastParams{.x = x.data(),
                                               .pos_to_token = gather ? pos.data() : nullptr,
                                               .q = q.data(),
                                               .sf = sf.data(),
                                               .num_tokens = t,
                                               .hidden = h,
                                               .rows = gather ? rows : 0,
                                               .round_sf = round_sf},
                          kExact);
}

}  // namespace

DEEPINFER_KERNEL_CASES(cast_cases) {
  cases.push_back({"cast_e2m1", "m=7 k=512", true, [] { return run_e2m1(7, 512, false, 1); }});
  cases.push_back({"cast_e2m1", "m=64 k=7168", false, [] { return run_e2m1(64, 7168, false, 2); }});
  cases.push_back({"cast_back_e2m1", "m=7 k=512", true, [] { return run_e2m1(7, 512, true, 3); }});
  cases.push_back(
      {"cast_e5m6", "m=9 k=264", true, [] { return run_e5m6(9, 264, false, false, 4); }});
  cases.push_back(
      {"cast_e5m6", "m=9 k=264 round_sf", true, [] { return run_e5m6(9, 264, true, false, 5); }});
  cases.push_back(
      {"cast_back_e5m6", "m=9 k=264", true, [] { return run_e5m6(9, 264, false, true, 6); }});
  cases.push_back({"cast_e2m1_to_e4m3", "m=5 k=512 block=128", true,
                   [] { return run_lossless(5, 512, 128, 7); }});
  cases.push_back({"cast_e2m1_to_e4m3", "m=5 k=256 block=64", true,
                   [] { return run_lossless(5, 256, 64, 8); }});
  cases.push_back({"per_channel_cast", "t=300 h=512", true,
                   [] { return run_per_channel(300, 512, false, false, 9); }});
  cases.push_back({"per_channel_cast", "t=200 h=384 gather round_sf", true,
                   [] { return run_per_channel(200, 384, true, true, 10); }});
}

}  // namespace deepinfer::kernels::testing
