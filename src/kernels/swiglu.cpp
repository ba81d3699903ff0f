// SwiGLU: parameter checks and dispatch.
#include "kernels/swiglu.h"

#include <deepinfer/error.h>

#include "core/check.h"

namespace deepinfer::kernels {

void SwigluParams::validate() const {
  DI_CHECK(num_tokens >= 0, "swiglu: num_tokens must be >= 0, got {}", num_tokens);
  DI_CHECK(inter > 0, "swiglu: inter must be > 0, got {}", inter);
  DI_CHECK(x_stride() >= inter, "swiglu: in_stride {} < inter {}", in_stride, inter);
  DI_CHECK(y_stride() >= inter, "swiglu: out_stride {} < inter {}", out_stride, inter);
  DI_CHECK(num_tokens == 0 || (gate && up), "swiglu: gate and up must be set");
  DI_CHECK((q == nullptr) == (scales == nullptr), "swiglu: the fused cast needs both q and scales");
  DI_CHECK(num_tokens == 0 || y || q, "swiglu: no output set (y, or q + scales)");
}

void swiglu(const SwigluParams& p) { dispatch(p, host::swiglu, cpu::swiglu); }

}  // namespace deepinfer::kernels
