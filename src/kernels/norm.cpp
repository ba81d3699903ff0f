// RMSNorm / residual add: parameter checks and dispatch.
#include "kernels/norm.h"

#include <deepinfer/error.h>

#include <cmath>

#include "core/check.h"

namespace deepinfer::kernels {

void RmsNormParams::validate() const {
  DI_CHECK(num_tokens >= 0, "rms_norm: num_tokens must be >= 0, got {}", num_tokens);
  DI_CHECK(hidden > 0, "rms_norm: hidden must be > 0, got {}", hidden);
  DI_CHECK(x_stride() >= hidden, "rms_norm: in_stride {} < hidden {}", in_stride, hidden);
  DI_CHECK(y_stride() >= hidden, "rms_norm: out_stride {} < hidden {}", out_stride, hidden);
  DI_CHECK(eps >= 0.0f && std::isfinite(eps), "rms_norm: eps must be finite and >= 0, got {}", eps);
  DI_CHECK(num_tokens == 0 || (x && w), "rms_norm: x and w must be set");
  DI_CHECK((q == nullptr) == (scales == nullptr),
           "rms_norm: the fused cast needs both q and scales");
  DI_CHECK(num_tokens == 0 || y || q, "rms_norm: no output set (y, or q + scales)");
}

void ResidualAddParams::validate() const {
  DI_CHECK(n >= 0, "residual_add: n must be >= 0, got {}", n);
  DI_CHECK(n == 0 || (a && b && out), "residual_add: a, b and out must be set");
}

void BiasAddParams::validate() const {
  DI_CHECK(rows >= 0 && cols >= 1, "bias_add: bad shape rows={} cols={}", rows, cols);
  DI_CHECK(rows == 0 || (x && bias && out), "bias_add: x, bias and out must be set");
}

void bias_add(const BiasAddParams& p) { dispatch(p, host::bias_add, cpu::bias_add); }
void rms_norm(const RmsNormParams& p) { dispatch(p, host::rms_norm, cpu::rms_norm); }
void residual_add(const ResidualAddParams& p) {
  dispatch(p, host::residual_add, cpu::residual_add);
}

}  // namespace deepinfer::kernels
