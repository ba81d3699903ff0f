// Payloads that encode their origin (nccl-tests / DeepEP habit): element i of the block that
// rank `src` sends to rank `dst` in case `salt` has bits pattern_bits(dtype, block_seed(...) + i),
// so a checker recomputes every expected element from its position alone and can attribute
// each wrong one to (source rank, index).
#pragma once

#include <deepinfer/dtype.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace deepinfer::conformance {

// splitmix64's finaliser: a bijection on 64 bits with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t block_seed(uint64_t salt, int src, int dst) {
  return mix64(salt ^ mix64((uint64_t(uint32_t(src)) << 32) | uint32_t(dst)));
}

// The element's bits in the low dtype_size(dtype) bytes (the rest zero). Full-range values:
// i32 mostly within 2^24 of ±2^31, i64 any, f32/f64 a mix of denormals, -0, large
// magnitudes, inf/NaN payloads and normals; bf16/u8 any bit pattern.
uint64_t pattern_bits(DType dtype, uint64_t key);

inline uint64_t load_bits(const void* p, size_t elem_bytes) {
  uint64_t v = 0;
  std::memcpy(&v, p, elem_bytes);  // little endian: low bytes
  return v;
}
inline void store_bits(void* p, size_t elem_bytes, uint64_t v) { std::memcpy(p, &v, elem_bytes); }

// Fills n elements: element i gets pattern_bits(dtype, seed + i).
void fill_pattern(void* dst, size_t n, DType dtype, uint64_t seed);

// "2147483000", "-0 (0x80000000)", "1.5e+38 (0x7e...)": a value for error messages.
std::string format_bits(DType dtype, uint64_t bits);

}  // namespace deepinfer::conformance
