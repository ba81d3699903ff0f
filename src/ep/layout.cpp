// layout() and the local input checks.
#include <deepinfer/ep.h>
#include <fmt/format.h>

#include "core/check.h"
#include "ep/validate.h"

namespace deepinfer::ep {
namespace {

// A tensor was passed: it has storage, or it is an empty [0, ...] view (null data allowed).
bool present(const Tensor& t) { return t.defined() || (t.ndim() > 0 && t.numel() == 0); }

std::string shape_str(const Tensor& t) { return present(t) ? t.describe() : "undefined"; }

bool is_2d(const Tensor& t, DType dt, int64_t rows, int64_t cols) {
  return present(t) && t.dtype() == dt && t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols &&
         t.is_contiguous();
}

}  // namespace

std::string check_topk_idx(const Tensor& topk_idx, const EPConfig& cfg) {
  const int k = cfg.num_topk;
  if (!present(topk_idx) || topk_idx.dtype() != DType::i64 || topk_idx.ndim() != 2 ||
      topk_idx.dim(1) != k || !topk_idx.is_contiguous())
    return fmt::format("topk_idx must be a contiguous i64 [T, K={}] tensor, got {}", k,
                       shape_str(topk_idx));
  const int64_t t_count = topk_idx.dim(0);
  if (t_count > cfg.num_max_tokens_per_rank)
    return fmt::format(
        "T = {} tokens exceeds num_max_tokens_per_rank M = {}; raise M in the EPConfig", t_count,
        cfg.num_max_tokens_per_rank);
  const int64_t* idx = topk_idx.data<int64_t>();
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t* row = idx + t * k;
    for (int j = 0; j < k; ++j) {
      if (row[j] < -1 || row[j] >= cfg.num_experts)
        return fmt::format(
            "topk_idx[{}, {}] = {} is out of range; expert ids are -1 (masked) or in [0, {})", t, j,
            row[j], cfg.num_experts);
      if (row[j] < 0) continue;
      for (int i = 0; i < j; ++i)
        if (row[i] == row[j])
          return fmt::format(
              "topk_idx row {} repeats expert {} (slots {} and {}); experts in a row must be "
              "distinct",
              t, row[j], i, j);
    }
  }
  return {};
}

std::string check_x(const Tensor& x, const Tensor& scales, int64_t num_tokens,
                    const EPConfig& cfg) {
  const bool fp8 = cfg.dispatch_dtype == DispatchDType::fp8;
  const DType xdt = fp8 ? DType::e4m3 : DType::bf16;
  if (!is_2d(x, xdt, num_tokens, cfg.hidden))
    return fmt::format("x must be a contiguous {} [T={}, H={}] tensor, got {}", dtype_name(xdt),
                       num_tokens, cfg.hidden, shape_str(x));
  if (fp8 && !is_2d(scales, DType::f32, num_tokens, cfg.scale_cols()))
    return fmt::format(
        "fp8 dispatch needs scales as a contiguous f32 [T={}, ceil(H/128)={}] tensor, got {}",
        num_tokens, cfg.scale_cols(), shape_str(scales));
  if (!fp8 && present(scales))
    return "scales were given but the EPConfig dispatch dtype is bf16; pass no scales or set fp8";
  return {};
}

std::string check_dispatch_input(const DispatchInput& in, const EPConfig& cfg) {
  std::string err = check_topk_idx(in.topk_idx, cfg);
  if (!err.empty()) return err;
  const int64_t t_count = in.topk_idx.dim(0);
  err = check_x(in.x, in.scales, t_count, cfg);
  if (!err.empty()) return err;
  if (!is_2d(in.topk_weights, DType::f32, t_count, cfg.num_topk))
    return fmt::format("topk_weights must be a contiguous f32 [T={}, K={}] tensor, got {}", t_count,
                       cfg.num_topk, shape_str(in.topk_weights));
  return {};
}

}  // namespace deepinfer::ep

namespace deepinfer {

Layout EPBuffer::layout(const Tensor& topk_idx) const {
  const EPConfig& cfg = config();
  const std::string err = ep::check_topk_idx(topk_idx, cfg);
  if (!err.empty()) DI_FAIL("ep layout: {}", err);
  const int w = world_size();
  const int64_t t_count = topk_idx.dim(0), k = cfg.num_topk;
  const int64_t local = cfg.num_experts / w;
  Layout out;
  out.num_tokens_per_rank.assign(size_t(w), 0);
  out.num_tokens_per_expert.assign(size_t(cfg.num_experts), 0);
  out.is_token_in_rank.assign(size_t(t_count) * size_t(w), 0);
  const int64_t* idx = topk_idx.data<int64_t>();
  for (int64_t t = 0; t < t_count; ++t) {
    uint8_t* in_rank = out.is_token_in_rank.data() + t * w;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[t * k + j];
      if (e < 0) continue;
      out.num_tokens_per_expert[size_t(e)] += 1;
      in_rank[e / local] = 1;
    }
    for (int r = 0; r < w; ++r) out.num_tokens_per_rank[size_t(r)] += in_rank[r];
  }
  return out;
}

}  // namespace deepinfer
