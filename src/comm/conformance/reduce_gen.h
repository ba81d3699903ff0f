// Reduction inputs with closed-form results for the conformance suite (all_reduce and
// reduce_scatter): every expected element is computed in O(1), independent of any backend.
#pragma once

#include <deepinfer/comm.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "comm/conformance/patterns.h"

namespace deepinfer::conformance {

// Uniform in [-x, x] from h (x <= INT64_MAX), without signed overflow.
inline int64_t uniform_sym(uint64_t h, int64_t x) {
  const uint64_t span = 2 * uint64_t(x) + 1;  // <= 2^64 - 1
  return int64_t(h % span - uint64_t(x));
}

// Reduction inputs with closed-form results. Rank r holds v(r, i) = a_i + p * b_i with
// p = (r + i) mod W, a permutation of 0..W-1 over the ranks, so
//   sum = W a + b W(W-1)/2,   max/min = a or a + (W-1) b (by the sign of b),
// and the ranges below keep every value and partial sum exact in the element type.
template <class T>
struct ReduceTerms {
  int64_t a = 0, b = 0;  // integers: the values; floats: mantissas scaled by 2^e
  int e = 0;
  bool neg_zero = false;  // every rank holds -0 (floats)
};

template <class T>
class ReduceGen {
 public:
  static constexpr bool kFloat = std::is_floating_point_v<T>;
  static constexpr int kDigits = std::numeric_limits<T>::digits;  // 24 / 53 for floats
  static constexpr int kEmin = std::numeric_limits<T>::min_exponent - kDigits;  // denormal ulp
  static constexpr int kEmax = std::numeric_limits<T>::max_exponent - kDigits;  // |v| < 2^(max-1)

  ReduceGen(int world, ReduceOp op, uint64_t salt) : w_(world), op_(op), salt_(salt) {
    if constexpr (kFloat) {
      mb_ = (int64_t(1) << (kDigits - 2)) / (int64_t(w_) * w_);
      ma_ = (int64_t(1) << (kDigits - 2)) / w_;
      for (int e = kEmin; e <= kEmax; ++e) pow2_.push_back(std::ldexp(T(1), e));
    } else {
      constexpr int64_t m = std::numeric_limits<T>::max();
      if (op == ReduceOp::sum) {
        mb_ = m / (int64_t(w_) * w_);
        ma_ = (m - mb_ * (int64_t(w_) * (w_ - 1) / 2)) / w_;
      } else {
        mb_ = (m / 2) / w_;
        ma_ = m / 2;
      }
    }
  }

  ReduceTerms<T> terms(size_t i) const {
    const uint64_t h = mix64(salt_ + i);
    const uint64_t h2 = mix64(h);
    ReduceTerms<T> t;
    if constexpr (kFloat) {
      if ((h >> 59) == 0) {
        t.neg_zero = true;
        return t;
      }
      switch ((h >> 56) & 7) {
        case 0:
          t.e = kEmin;
          break;  // denormals
        case 1:
          t.e = kEmax - int((h >> 48) & 7);
          break;  // near the top of the range
        default:
          t.e = -30 + int((h >> 40) % 61);
          break;
      }
      t.a = uniform_sym(h2, ma_);
      t.b = uniform_sym((h2 >> 1) ^ h, mb_);
    } else {
      constexpr int64_t kMax = std::numeric_limits<T>::max();
      constexpr int64_t kMin = std::numeric_limits<T>::min();
      const int64_t off = int64_t(h2 & 0xffff);
      const int64_t bh = int64_t(uniform_sym(h2 >> 16, mb_));
      switch (h & 3) {
        case 0:  // within 2^16 of the maximum, moving inward
          t.a = op_ == ReduceOp::sum ? ma_ - off : kMax - off;
          t.b = -std::abs(bh);
          break;
        case 1:  // within 2^16 of the minimum, moving inward
          t.a = op_ == ReduceOp::sum ? -ma_ + off : kMin + off;
          t.b = std::abs(bh);
          break;
        default:
          t.a = uniform_sym(h2, ma_);
          t.b = bh;
          break;
      }
    }
    return t;
  }

  T value(const ReduceTerms<T>& t, int p) const {
    if constexpr (kFloat) {
      if (t.neg_zero) return T(-0.0);
      return T(t.a + int64_t(p) * t.b) * pow2_[size_t(t.e - kEmin)];
    } else {
      return T(t.a + int64_t(p) * t.b);
    }
  }

  T expected(const ReduceTerms<T>& t) const {
    if constexpr (kFloat) {
      if (t.neg_zero) return T(-0.0);
    }
    switch (op_) {
      case ReduceOp::sum: {
        const int64_t k = int64_t(w_) * t.a + t.b * (int64_t(w_) * (w_ - 1) / 2);
        if constexpr (kFloat)
          return T(k) * pow2_[size_t(t.e - kEmin)];
        else
          return T(k);
      }
      case ReduceOp::max:
        return value(t, t.b > 0 ? w_ - 1 : 0);
      case ReduceOp::min:
        return value(t, t.b > 0 ? 0 : w_ - 1);
    }
    return T(0);
  }

 private:
  int w_;
  ReduceOp op_;
  uint64_t salt_;
  int64_t ma_ = 0, mb_ = 0;
  std::vector<T> pow2_;
};

}  // namespace deepinfer::conformance
