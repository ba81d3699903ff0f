// cpu: the casts of cast.h, rows (per_channel_cast: 128-row blocks × 256-channel strips) over
// kernel_pool(). Same row bodies as host, so the bytes match by construction.
#include "kernels/cast.h"

namespace deepinfer::kernels::cpu {
namespace {

template <class P>
void rows(const P& p, void (*row)(const P&, int64_t)) {
  p.validate();
  kernel_pool().parallel_for(p.m, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, p.k)),
                             [&](int64_t r0, int64_t r1) {
                               for (int64_t r = r0; r < r1; ++r) row(p, r);
                             });
}

}  // namespace

void cast_e2m1(const CastE2m1Params& p) { rows(p, cast_e2m1_row); }
void cast_back_e2m1(const CastBackE2m1Params& p) { rows(p, cast_back_e2m1_row); }
void cast_e5m6(const CastE5m6Params& p) { rows(p, cast_e5m6_row); }
void cast_back_e5m6(const CastBackE5m6Params& p) { rows(p, cast_back_e5m6_row); }
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p) { rows(p, cast_e2m1_to_e4m3_row); }

void per_channel_cast(const PerChannelCastParams& p) {
  p.validate();
  constexpr int64_t kStrip = 256;
  const int64_t strips = (p.hidden + kStrip - 1) / kStrip;
  kernel_pool().parallel_for(p.sf_rows() * strips, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / strips, s = i % strips;
      per_channel_cast_block(p, b, s * kStrip, std::min(p.hidden, (s + 1) * kStrip));
    }
  });
}

}  // namespace deepinfer::kernels::cpu
