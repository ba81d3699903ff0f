// Reading one element of a typed buffer as double: what value comparisons (the kernel harness,
// `deepinfer diff`) need, whatever the buffer's dtype.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>

namespace deepinfer {

constexpr bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::e4m3 ||
         t == DType::e5m2;
}

// Element i of a buffer of `t`, widened to double (exact for every type but i64 beyond 2^53).
inline double load_as_double(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f64:
      return static_cast<const double*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const bf16*>(p)[i]);
    case DType::e4m3:
      return e4m3_to_f32(static_cast<const fp8_e4m3*>(p)[i]);
    case DType::e5m2:
      return e5m2_to_f32(static_cast<const fp8_e5m2*>(p)[i]);
    case DType::i8:
      return static_cast<const int8_t*>(p)[i];
    case DType::u8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DType::i64:
      return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

}  // namespace deepinfer
