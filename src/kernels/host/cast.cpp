// Host: the casts of cast.h, one row after another.
#include "kernels/cast.h"

namespace deepinfer::kernels::host {

void cast_e2m1(const CastE2m1Params& p) {
  p.validate();
  for (int64_t r = 0; r < p.m; ++r) cast_e2m1_row(p, r);
}
void cast_back_e2m1(const CastBackE2m1Params& p) {
  p.validate();
  for (int64_t r = 0; r < p.m; ++r) cast_back_e2m1_row(p, r);
}
void cast_e5m6(const CastE5m6Params& p) {
  p.validate();
  for (int64_t r = 0; r < p.m; ++r) cast_e5m6_row(p, r);
}
void cast_back_e5m6(const CastBackE5m6Params& p) {
  p.validate();
  for (int64_t r = 0; r < p.m; ++r) cast_back_e5m6_row(p, r);
}
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p) {
  p.validate();
  for (int64_t r = 0; r < p.m; ++r) cast_e2m1_to_e4m3_row(p, r);
}
void per_channel_cast(const PerChannelCastParams& p) {
  p.validate();
  for (int64_t b = 0; b < p.sf_rows(); ++b) per_channel_cast_block(p, b, 0, p.hidden);
}

}  // namespace deepinfer::kernels::host
