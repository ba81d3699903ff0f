// The DeepSeek architecture, one file (as llama.cpp's src/models/deepseek2.cpp). Rounding
// points follow tools/reference/NUMERICS.md; every kernel goes through the dispatching
// deepinfer::kernels functions under a KernelTag naming the layer part, for `deepinfer diff`.
#include "model/deepseek.h"

#include <deepinfer/engram.h>
#include <deepinfer/error.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <utility>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "kernels/attention.h"
#include "kernels/engram.h"
#include "kernels/gemm.h"
#include "kernels/mhc.h"
#include "kernels/norm.h"
#include "kernels/quant.h"
#include "kernels/recorder.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/swiglu.h"

namespace deepinfer::model {

namespace k = deepinfer::kernels;

namespace {

constexpr float kEngramGateClamp = 1e-6f;   // the gate's sqrt clamp (docs/engram.md §1.3)
constexpr float kShortConvNormEps = 1e-5f;  // the short conv's RMSNorm eps

// A growable scratch buffer: pointers stay valid until the next grow.
template <class T>
struct Scratch {
  std::vector<T> v;
  T* get(int64_t n) {
    if (int64_t(v.size()) < std::max<int64_t>(n, 1)) v.resize(size_t(std::max<int64_t>(n, 1)));
    return v.data();
  }
};

// A linear's input: bf16 activations, and optionally their 1×128 fp8 cast (computed once when
// several fp8 linears read the same x).
struct Act {
  const bf16* x = nullptr;        // [T, K]
  const fp8_e4m3* q = nullptr;    // [T, K] or null
  const float* scales = nullptr;  // [T, num_blocks(K)] or null
};

k::RopeConfig rope_config(const ModelConfig& c) {
  k::RopeConfig r;
  r.rope_dim = c.qk_rope_head_dim;
  r.theta = c.rope_theta;
  r.yarn = c.rope_scaling.enabled;
  r.scaling.factor = float(c.rope_scaling.factor);
  r.scaling.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  r.scaling.beta_fast = float(c.rope_scaling.beta_fast);
  r.scaling.beta_slow = float(c.rope_scaling.beta_slow);
  r.scaling.mscale = float(c.rope_scaling.mscale);
  r.scaling.mscale_all_dim = float(c.rope_scaling.mscale_all_dim);
  return r;
}

size_t mlp_bytes(const Mlp& m) {
  return m.gate.weight_bytes() + m.up.weight_bytes() + m.down.weight_bytes();
}

}  // namespace

// Per-layer attention weights derived once at construction: kv_b as bf16(q·S) (NUMERICS: kv_b
// is never an fp8 linear), and W_UK transposed per head so q̃ = q_nope·W_UK is an NT GEMM.
struct AbsorbedKvB {
  Tensor w_bf16;  // [H·(dn + dv), r] bf16 (owned, or borrowed from a BF16 Linear)
  Tensor w_uk_t;  // [H, r, dn] bf16
  // Each head's W_UK (of w_uk_t) and W_UV (of w_bf16) in the pairs layout
  // (kernels::pack_bf16_pairs: uint32 words), [H, words]; undefined where the CPU has no use for
  // it. In weight storage: decode streams them every step, on huge pages like the checkpoint's.
  Tensor uk_pairs, uv_pairs;
};

struct DeepseekModel::Impl {
  std::shared_ptr<const ModelWeights> w;
  const ModelConfig& cfg;
  Group& group;
  ModelOptions opts;
  std::unique_ptr<EPBuffer> ep;
  bool fp8_experts = false;
  std::vector<AbsorbedKvB> kvb;  // per layer
  std::vector<float> inv_freq;   // [rope/2]
  float attention_factor = 1.0f;
  float softmax_scale = 0.0f;

  // Scratch (per rank; forward is not reentrant).
  Scratch<bf16> h, h_alt, xn, t0, t1, q, kv, kvrow, qabs, olat, ocat, attn, head_in, ffn_out, gbuf,
      ubuf, shared_out, gath, mhc_x, eg_v, eg_k, eg_gated, eg_win, eg_s;
  Scratch<float> mhc_post_w, mhc_comb, eg_f32, eg_gate, head_part, head_back;
  Scratch<bf16> head_rows;
  Scratch<uint8_t> split_send, split_recv;  // the split dense FFN's packed rows
  Scratch<int32_t> eg_ids, eg_idx, eg_taps;
  std::vector<int32_t> attn_tables, attn_seqlens;  // a batched mla_decode call's block table
  // Engram: the table shards, and each layer's fetch of this forward.
  std::unique_ptr<EngramBuffer> engram_buf;
  std::vector<EngramFetch> eg_fetch;
  int64_t hc = 1;  // mHC branches
  Scratch<fp8_e4m3> xq, tq, shared_q, split_q;
  Scratch<float> xs, ts, router_logits, topk_w, margins, shared_s, split_s;
  Scratch<bf16> split_part;
  Scratch<int64_t> topk_idx, positions;

  Impl(std::shared_ptr<const ModelWeights> weights, Group& g, const ModelOptions& o)
      : w(std::move(weights)), cfg(w->config), group(g), opts(o), hc(cfg.hc_mult) {
    DI_CHECK(opts.max_tokens_per_step > 0, "max_tokens_per_step must be positive, got {}",
             opts.max_tokens_per_step);
    if (cfg.engram.enabled()) engram_setup();
    const auto rc = rope_config(cfg);
    inv_freq = k::rope_inv_freq(rc);
    attention_factor = k::rope_attention_factor(rc);
    softmax_scale = k::mla_softmax_scale(cfg.qk_head_dim(), rc);
    const int64_t H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim,
                  r = cfg.kv_lora_rank;
    for (const auto& L : w->layers) {
      AbsorbedKvB a;
      const Linear& kb = L.kv_b;
      if (kb.fp8()) {
        a.w_bf16 = Tensor::empty(DType::bf16, {kb.out, kb.in});
        k::DequantBlockParams p;
        p.q = kb.w_fp8;
        p.scales = kb.w_scale;
        p.out = a.w_bf16.data<bf16>();
        p.n = kb.out;
        p.k = kb.in;
        k::KernelTag tag("load.kv_b");
        k::dequant_per_block(p);
      } else {
        a.w_bf16 = Tensor::borrow(const_cast<bf16*>(kb.w_bf16), DType::bf16, {kb.out, kb.in});
      }
      a.w_uk_t = Tensor::empty(DType::bf16, {H, r, dn});
      const bf16* src = a.w_bf16.data<bf16>();
      bf16* dst = a.w_uk_t.data<bf16>();
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t c = 0; c < r; ++c)
            dst[(hh * r + c) * dn + d] = src[(hh * (dn + dv) + d) * r + c];
      if (const size_t uk = k::bf16_pairs_words(r, dn), uv = k::bf16_pairs_words(dv, r);
          uk > 0 && uv > 0) {
        const auto words = [&](size_t each) {
          return Tensor::borrow(detail::weight_alloc(size_t(H) * each * sizeof(uint32_t)),
                                DType::i32, {H, int64_t(each)});
        };
        a.uk_pairs = words(uk);
        a.uv_pairs = words(uv);
        for (int64_t hh = 0; hh < H; ++hh) {
          k::pack_bf16_pairs(dst + hh * r * dn, r, dn, a.uk_pairs.data<uint32_t>() + hh * uk);
          k::pack_bf16_pairs(src + (hh * (dn + dv) + dn) * r, dv, r,
                             a.uv_pairs.data<uint32_t>() + hh * uv);
        }
      }
      kvb.push_back(std::move(a));
    }
    int64_t first_moe = -1;
    for (size_t i = 0; i < w->layers.size(); ++i)
      if (w->layers[i].moe) {
        first_moe = int64_t(i);
        break;
      }
    if (first_moe >= 0) {
      const auto& L = w->layers[size_t(first_moe)];
      DI_CHECK(!L.experts.empty(), "rank {} holds no routed experts", group.rank());
      fp8_experts = L.experts[0].gate.fp8();
      EPConfig ec = opts.ep;
      ec.num_experts = int(cfg.n_routed_experts);
      ec.hidden = int(cfg.hidden_size);
      ec.num_topk = int(cfg.num_experts_per_tok);
      ec.num_max_tokens_per_rank = int(opts.max_tokens_per_step);
      ec.dispatch_dtype = fp8_experts ? DispatchDType::fp8 : DispatchDType::bf16;
      ec.expert_alignment = 1;
      ec.expand = true;
      ep = std::make_unique<EPBuffer>(group, ec);
    }
  }

  // ---- building blocks ----------------------------------------------------------------------

  void quantize(const bf16* x, int64_t T, int64_t K, fp8_e4m3* q, float* s) {
    k::QuantTokenParams p;
    p.x = x;
    p.q = q;
    p.scales = s;
    p.m = T;
    p.k = K;
    p.ue8m0 = cfg.ue8m0_scales;
    k::quant_per_token(p);
  }

  // out [T, l.out] bf16 = x·Wᵀ (fp8: 1×128 activation cast, block-scaled GEMM; bf16: BF16 GEMM).
  void linear(const Linear& l, const Act& a, int64_t T, bf16* out) {
    if (T == 0) return;
    if (l.fp8()) {
      const fp8_e4m3* q = a.q;
      const float* s = a.scales;
      if (q == nullptr) {
        DI_CHECK(a.x != nullptr, "linear {}: no input", l.name);
        fp8_e4m3* qq = tq.get(T * l.in);
        float* ss = ts.get(T * k::num_blocks(l.in));
        quantize(a.x, T, l.in, qq, ss);
        q = qq;
        s = ss;
      }
      k::gemm_fp8(fp8_gemm(l, q, s, T, out));
    } else {
      DI_CHECK(a.x != nullptr, "linear {}: BF16 weight needs bf16 input", l.name);
      k::GemmBf16Params p;
      p.a = a.x;
      p.w = l.w_bf16;
      p.out = out;
      p.m = T;
      p.n = l.out;
      p.k = l.in;
      k::gemm_bf16(p);
    }
  }

  // Linears of one input (out = x·Wᵀ each), the fp8 ones in one gemm_fp8_multi (one pool
  // dispatch); the same bytes as one linear() each.
  void linears(std::initializer_list<std::pair<const Linear*, bf16*>> ls, const Act& a, int64_t T) {
    if (T == 0) return;
    gemms_.clear();
    for (const auto& [l, out] : ls) queue_linear(*l, a, T, out);
    k::gemm_fp8_multi(gemms_);
  }

  // The most rows in all (every rank's) at which the ranks share the replicated work
  // (split_linears, plan_shared). Beyond it a rank's own rows already make its GEMMs
  // compute-bound, so a split saves no time and its gathers cost: at EP 2 on the synthetic model
  // (`bench decode --ab` against DEEPINFER_EP_SPLIT=off, docs/performance.md §8) 2 rows in all
  // gained 5-15%, 8 rows 0.5-5%, 16 rows -3 to +1%, 32 rows -3 to -1%.
  static constexpr int64_t kMaxSplitRows = 8;

  // Whether the ranks may share replicated work (split_linears, plan_shared): several ranks,
  // DEEPINFER_EP_SPLIT, and batch-invariant GEMMs (DEEPINFER_BATCH_INVARIANT, docs/numerics.md
  // §10), since the shared GEMMs take every rank's rows at once.
  bool splits_small_steps() const {
    return opts.split_replicated && group.size() > 1 && knobs().batch_invariant;
  }

  // Every rank's fp8 rows (codes q and 1×128 scales s, [T, n]) gathered in rank order into
  // split_q / split_s; rows[r] is rank r's count. Returns the total, or 0 (nothing gathered) where
  // no rank has rows or they are more than max_total. Every rank joins, with T = 0 too.
  int64_t gather_fp8_rows(const fp8_e4m3* q, const float* s, int64_t T, int64_t n,
                          std::vector<int64_t>& rows, const std::string& what,
                          int64_t max_total = std::numeric_limits<int64_t>::max()) {
    const size_t xb = packed_row_bytes(n);
    uint8_t* send = split_send.get(int64_t(size_t(T) * xb));
    pack_rows(q, s, T, n, send);
    const uint8_t* all =
        gather_rows(send, T, int64_t(xb), DType::u8, split_recv, rows, what, max_total);
    if (all == nullptr) return 0;
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    unpack_rows(all, total, n, split_q.get(total * n), split_s.get(total * k::num_blocks(n)));
    return total;
  }

  // Linears that share their input rows (ls: the weight and its output [T, out]), split by
  // output columns over the ranks where several ranks have few rows in all (≤ kMaxSplitRows):
  // every rank's fp8 input rows are gathered (all_gather_v; a bf16 input is cast first, as
  // linear() casts it), each rank computes its rank_columns of every linear for all the rows, and
  // the slices go back to their rows' ranks (all_to_all_v each), so the ranks read each weight
  // once between them, not W times (docs/ep.md §14). A column sums as in the whole GEMM (batch
  // invariance, column_slice), so out is what linears() gives. Else, or where a weight is not
  // fp8, each rank runs linears() on its own rows. Every rank joins in the same order, T = 0 too.
  void split_linears(std::initializer_list<std::pair<const Linear*, bf16*>> ls, const Act& a,
                     int64_t T, const std::string& what) {
    bool fp8 = true;
    for (const auto& [l, out] : ls) fp8 &= l->fp8();
    if (!fp8 || !splits_small_steps()) return linears(ls, a, T);
    const int64_t in = ls.begin()->first->in, W = group.size(), me = group.rank();
    const fp8_e4m3* q = a.q;
    const float* sc = a.scales;
    if (q == nullptr && T > 0) {
      fp8_e4m3* qq = tq.get(T * in);
      float* ss = ts.get(T * k::num_blocks(in));
      quantize(a.x, T, in, qq, ss);
      q = qq;
      sc = ss;
    }
    std::vector<int64_t> rows;
    const int64_t total = gather_fp8_rows(q, sc, T, in, rows, what, kMaxSplitRows);
    if (total == 0) return linears(ls, Act{a.x, q, sc}, T);
    const fp8_e4m3* aq = split_q.v.data();
    const float* as = split_s.v.data();
    int64_t width = 0;
    for (const auto& [l, out] : ls) {
      const auto [c0, c1] = rank_columns(l->out, me, W);
      width += c1 - c0;
    }
    bf16* part = split_part.get(total * width);  // each linear's [total, its columns], in turn
    gemms_.clear();
    int64_t at = 0;
    for (const auto& [l, out] : ls) {
      const auto [c0, c1] = rank_columns(l->out, me, W);
      if (c1 > c0) gemms_.push_back(fp8_gemm(column_slice(*l, c0, c1), aq, as, total, part + at));
      at += total * (c1 - c0);
    }
    k::gemm_fp8_multi(gemms_);
    at = 0;
    for (const auto& [l, out] : ls) {
      const auto [c0, c1] = rank_columns(l->out, me, W);
      return_rows(part + at, rows, T, l->out, DType::bf16, gath, out, what);
      at += total * (c1 - c0);
    }
  }

  // out = x·Wᵀ: an fp8 weight with the cast input at hand joins gemms_ (the caller's next
  // gemm_fp8_multi), anything else runs now through linear().
  void queue_linear(const Linear& l, const Act& a, int64_t T, bf16* out) {
    if (l.fp8() && a.q)
      gemms_.push_back(fp8_gemm(l, a.q, a.scales, T, out));
    else
      linear(l, a, T, out);  // bf16, or fp8 that casts x first (into tq)
  }

  void rms_norm(const bf16* x, const bf16* wt, int64_t T, int64_t dim, bf16* y,
                int64_t in_stride = 0, int64_t out_stride = 0, fp8_e4m3* q = nullptr,
                float* s = nullptr) {
    if (T == 0) return;
    k::RmsNormParams p;
    p.x = x;
    p.w = wt;
    p.y = y;
    p.q = q;
    p.scales = s;
    p.num_tokens = T;
    p.hidden = dim;
    p.in_stride = in_stride;
    p.out_stride = out_stride;
    p.eps = float(cfg.rms_norm_eps);
    p.ue8m0 = cfg.ue8m0_scales;
    k::rms_norm(p);
  }

  void residual_add(const bf16* a, const bf16* b, bf16* out, int64_t n) {
    if (n == 0) return;
    k::ResidualAddParams p;
    p.a = a;
    p.b = b;
    p.out = out;
    p.n = n;
    k::residual_add(p);
  }

  // SwiGLU MLP on T rows: out [T, hidden] = down(silu(gate·x) ⊙ up·x).
  void mlp(const Mlp& m, const Act& a, int64_t T, bf16* out) {
    MlpJob j{&m, a, T, out};
    mlp_up(std::span<MlpJob>(&j, 1));
    mlp_down(std::span<const MlpJob>(&j, 1));
  }

  // Several SwiGLU MLPs, each on its own rows (a MoE layer's shared and routed experts), in two
  // stages whose fp8 GEMMs are one gemm_fp8_multi each: the pool wakes twice per layer, not three
  // times per expert (docs/performance.md §8). Each row gets the bytes mlp() alone gives it.
  struct MlpJob {
    const Mlp* m = nullptr;
    Act in;  // [rows, hidden]
    int64_t rows = 0;
    bf16* out = nullptr;            // [rows, hidden]; needed by mlp_down only
    int64_t at = 0, at_blocks = 0;  // where its rows start in gbuf/ubuf/t1/tq and in ts
  };
  std::vector<k::GemmFp8Params> gemms_;
  std::vector<MlpJob> moe_jobs;

  k::GemmFp8Params fp8_gemm(const Linear& l, const fp8_e4m3* q, const float* s, int64_t T,
                            bf16* out) const {
    k::GemmFp8Params p;
    p.a = q;
    p.a_scales = s;
    p.w = l.w_fp8;
    p.w_scales = l.w_scale;
    p.w_decode = l.w_decode;
    p.out = out;
    p.m = T;
    p.n = l.out;
    p.k = l.in;
    return p;
  }

  // silu(gate) ⊙ up for rows of I channels (gate, up: row stride I), as its fp8 cast (q, s) where
  // the down projection is fp8, else as bf16 rows y.
  void swiglu(const bf16* gate, const bf16* up, int64_t rows, int64_t I, fp8_e4m3* q, float* s,
              bf16* y = nullptr) {
    k::SwigluParams sp;
    sp.gate = gate;
    sp.up = up;
    sp.num_tokens = rows;
    sp.inter = I;
    sp.in_stride = I;
    sp.ue8m0 = cfg.ue8m0_scales;
    sp.q = q;
    sp.scales = s;
    sp.y = y;
    k::swiglu(sp);
  }

  // Stage 1: gate·x and up·x, then SwiGLU (with the fp8 cast where down is fp8) into t1 or tq/ts.
  void mlp_up(std::span<MlpJob> jobs) {
    int64_t elems = 0, blocks = 0;
    for (MlpJob& j : jobs) {
      j.at = elems;
      j.at_blocks = blocks;
      elems += j.rows * j.m->gate.out;
      blocks += j.rows * k::num_blocks(j.m->gate.out);
    }
    if (elems == 0) return;
    bf16* g = gbuf.get(elems);
    bf16* u = ubuf.get(elems);
    gemms_.clear();
    for (const MlpJob& j : jobs) {
      if (j.rows == 0) continue;
      queue_linear(j.m->gate, j.in, j.rows, g + j.at);
      queue_linear(j.m->up, j.in, j.rows, u + j.at);
    }
    k::gemm_fp8_multi(gemms_);
    fp8_e4m3* q = tq.get(elems);
    float* s = ts.get(blocks);
    bf16* y = t1.get(elems);
    // One swiglu per run of jobs of one width (rows are independent).
    for (size_t i = 0; i < jobs.size();) {
      const int64_t I = jobs[i].m->gate.out;
      const bool fp8_down = jobs[i].m->down.fp8();
      int64_t rows = 0;
      size_t e = i;
      for (; e < jobs.size() && jobs[e].m->gate.out == I && jobs[e].m->down.fp8() == fp8_down; ++e)
        rows += jobs[e].rows;
      if (rows > 0) {
        if (fp8_down)
          swiglu(g + jobs[i].at, u + jobs[i].at, rows, I, q + jobs[i].at, s + jobs[i].at_blocks);
        else
          swiglu(g + jobs[i].at, u + jobs[i].at, rows, I, nullptr, nullptr, y + jobs[i].at);
      }
      i = e;
    }
  }

  // Stage 2: out = down(SwiGLU) from what mlp_up left in t1 or tq/ts.
  void mlp_down(std::span<const MlpJob> jobs) {
    gemms_.clear();
    for (const MlpJob& j : jobs) {
      if (j.rows == 0) continue;
      // SwiGLU wrote the fp8 cast (tq/ts) where down is fp8, else bf16 rows (t1).
      const Act in = j.m->down.fp8() ? Act{nullptr, tq.v.data() + j.at, ts.v.data() + j.at_blocks}
                                     : Act{t1.v.data() + j.at};
      queue_linear(j.m->down, in, j.rows, j.out);
    }
    k::gemm_fp8_multi(gemms_);
  }

  // ---- rows that only feed the cache ---------------------------------------------------------

  // The rows whose block output is read: a chunk's positions when it wants all their logits,
  // else its last. The other rows of a layer only need their latent in the cache (the MTP
  // module's catch-up in a speculative step, docs/architecture.md §6.1).
  static std::vector<SeqChunk> kept_rows(const std::vector<SeqChunk>& chunks) {
    std::vector<SeqChunk> kept = chunks;
    for (SeqChunk& c : kept)
      if (!c.all_logits && c.num_tokens > 1) {
        c.start_pos += c.num_tokens - 1;
        c.tokens += c.num_tokens - 1;
        c.num_tokens = 1;
      }
    return kept;
  }

  // Moves each chunk's kept rows (its last kept[i].num_tokens of width elements) to the front of
  // x, in chunk order; returns their count.
  static int64_t compact_rows(bf16* x, int64_t width, const std::vector<SeqChunk>& chunks,
                              const std::vector<SeqChunk>& kept) {
    int64_t t = 0, o = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int64_t n = chunks[i].num_tokens, nk = kept[i].num_tokens;
      if (o != t + n - nk && nk > 0)
        std::memmove(x + o * width, x + (t + n - nk) * width, size_t(nk * width) * sizeof(bf16));
      t += n;
      o += nk;
    }
    return o;
  }

  // ---- attention ------------------------------------------------------------------------------

  // Returns MLA(RMSNorm(x)) [T, hidden] bf16 (null when T = 0); x [T, hidden] is the sub-layer
  // input (the residual itself when hc_mult = 1). With `kept` (kept_rows below), every row's
  // latent still goes to the cache but only the kept rows attend: the output has their rows.
  const bf16* attention(int64_t li, const std::vector<SeqChunk>& chunks, PagedKvCache& cache,
                        int64_t T, const bf16* hbuf, const std::vector<SeqChunk>* kept = nullptr) {
    const LayerWeights& L = w->layers[size_t(li)];
    const int64_t hid = cfg.hidden_size, H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim,
                  dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, r = cfg.kv_lora_rank,
                  qk = dn + dr, row = r + dr;
    if (T == 0) {  // no rows: join the projections' splits (split_linears) in their order
      if (cfg.q_lora_rank > 0) {
        split_linears({{&L.q_a, nullptr}, {&L.kv_a, nullptr}}, Act{}, 0, "attn.in");
        split_linears({{&L.q_b, nullptr}}, Act{}, 0, "attn.q_b");
      } else {
        split_linears({{&L.q, nullptr}, {&L.kv_a, nullptr}}, Act{}, 0, "attn.in");
      }
      split_linears({{&L.o, nullptr}}, Act{}, 0, "attn.o");
    }
    if (T > 0) {
      bf16* x = xn.get(T * hid);
      fp8_e4m3* xq8 = xq.get(T * hid);
      float* xs8 = xs.get(T * k::num_blocks(hid));
      rms_norm(hbuf, L.input_norm, T, hid, x, 0, 0, xq8, xs8);  // [T, hid] bf16 + its fp8 cast
      const Act xa{x, xq8, xs8};
      bf16* qb = q.get(T * H * qk);  // [T, H, qk]
      bf16* kvb_ = kv.get(T * row);  // [T, r + dr]
      if (cfg.q_lora_rank > 0) {
        bf16* qa = t0.get(T * cfg.q_lora_rank);
        // [T, q_lora], [T, r + dr]
        split_linears({{&L.q_a, qa}, {&L.kv_a, kvb_}}, xa, T, "attn.in");
        rms_norm(qa, L.q_a_norm, T, cfg.q_lora_rank, qa);
        split_linears({{&L.q_b, qb}}, Act{qa}, T, "attn.q_b");
      } else {
        split_linears({{&L.q, qb}, {&L.kv_a, kvb_}}, xa, T, "attn.in");
      }
      bf16* kr = kvrow.get(T * row);  // [T, r + dr]: [c_n | k_pe]
      rms_norm(kvb_, L.kv_a_norm, T, r, kr, row, row);
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(kr + t * row + r, kvb_ + t * row + r, size_t(dr) * sizeof(bf16));
      // Positions of the T tokens.
      int64_t* pos = positions.get(T);
      {
        int64_t t = 0;
        for (const auto& c : chunks)
          for (int64_t j = 0; j < c.num_tokens; ++j) pos[t++] = c.start_pos + j;
      }
      k::RopeParams rp;
      rp.positions = pos;
      rp.inv_freq = inv_freq.data();
      rp.num_tokens = T;
      rp.rope_dim = dr;
      rp.attention_factor = attention_factor;
      rp.x = qb;  // q_pe of every head
      rp.num_heads = H;
      rp.token_stride = H * qk;
      rp.head_stride = qk;
      rp.offset = dn;
      k::rope(rp);
      rp.x = kr;  // the shared k_pe
      rp.num_heads = 1;
      rp.token_stride = row;
      rp.head_stride = row;
      rp.offset = r;
      k::rope(rp);
      // Absorbed query [T, H, r + dr] = [q_nope·W_UK | q_pe] per head: one batched GEMM over
      // the heads, reading q_nope in place and writing into the head's slot.
      bf16* qa_ = qabs.get(T * H * row);
      {
        k::GemmBf16Params gp;
        gp.a = qb;
        gp.w = kvb[size_t(li)].w_uk_t.data<bf16>();
        gp.out = qa_;
        gp.m = T;
        gp.n = r;
        gp.k = dn;
        gp.batch = H;
        gp.lda = H * qk;
        gp.ldo = H * row;
        gp.a_batch = qk;
        gp.w_batch = r * dn;
        gp.out_batch = row;
        if (kvb[size_t(li)].uk_pairs.defined())
          gp.w_pairs = kvb[size_t(li)].uk_pairs.data<uint32_t>();
        k::gemm_bf16(gp);  // [T, H, :r]
      }
      for (int64_t i = 0; i < T * H; ++i)
        std::memcpy(qa_ + i * row + r, qb + i * qk + dn, size_t(dr) * sizeof(bf16));
      // Write the new latent rows to the cache, then attend chunk by chunk over the cache.
      {
        int64_t t = 0;
        for (const auto& c : chunks)
          for (int64_t j = 0; j < c.num_tokens; ++j, ++t)
            std::memcpy(cache.row(li, c.cache_seq, c.start_pos + j), kr + t * row,
                        size_t(row) * sizeof(bf16));
      }
      // The kept queries: each chunk's last rows, moved to the front in chunk order.
      const int64_t To = kept ? compact_rows(qa_, H * row, chunks, *kept) : T;
      bf16* ol = olat.get(To * H * r);  // [To, H, r] latent outputs
      // Consecutive chunks with the same query count go as one call (a decode batch: one call per
      // layer instead of one per sequence); the kernel's result for a sequence does not depend on
      // the others in the call.
      const auto queries = [&](size_t ci) {
        return kept ? (*kept)[ci].num_tokens : chunks[ci].num_tokens;
      };
      int64_t t = 0;
      for (size_t ci = 0; ci < chunks.size();) {
        const int64_t nq = queries(ci);
        if (nq == 0) {
          ++ci;
          continue;
        }
        size_t cj = ci + 1;
        int64_t pages = int64_t(cache.block_table(chunks[ci].cache_seq).size());
        for (; cj < chunks.size() && queries(cj) == nq; ++cj)
          pages = std::max(pages, int64_t(cache.block_table(chunks[cj].cache_seq).size()));
        const int64_t B = int64_t(cj - ci);
        attn_tables.assign(size_t(B * pages), 0);
        attn_seqlens.resize(size_t(B));
        for (int64_t b = 0; b < B; ++b) {
          const SeqChunk& c = chunks[ci + size_t(b)];
          const auto& table = cache.block_table(c.cache_seq);
          std::copy(table.begin(), table.end(), attn_tables.begin() + b * pages);
          attn_seqlens[size_t(b)] = int32_t(c.start_pos + c.num_tokens);
        }
        k::MlaDecodeParams ap;
        ap.q = qa_ + t * H * row;
        ap.kv_cache = cache.pages(li);
        ap.block_table = attn_tables.data();
        ap.cache_seqlens = attn_seqlens.data();
        ap.o = ol + t * H * r;
        ap.batch = B;
        ap.s_q = nq;  // the last nq of each chunk's positions (bottom-right causal)
        ap.num_heads = H;
        ap.head_dim = row;
        ap.head_dim_v = r;
        ap.page_size = cache.config().page_size;
        ap.num_pages = cache.config().num_pages;
        ap.max_pages_per_seq = pages;
        ap.softmax_scale = softmax_scale;
        ap.causal = true;
        k::mla_decode(ap);
        t += B * nq;
        ci = cj;
      }
      T = To;
      // o_h = W_UV,h · ō_h, heads concatenated [T, H·dv]: one batched GEMM over the heads.
      bf16* oc = ocat.get(T * H * dv);
      {
        k::GemmBf16Params gp;
        gp.a = ol;
        gp.w = kvb[size_t(li)].w_bf16.data<bf16>() + dn * r;
        gp.out = oc;
        gp.m = T;
        gp.n = dv;
        gp.k = r;
        gp.batch = H;
        gp.lda = H * r;
        gp.ldo = H * dv;
        gp.a_batch = r;
        gp.w_batch = (dn + dv) * r;
        gp.out_batch = dv;
        if (kvb[size_t(li)].uv_pairs.defined())
          gp.w_pairs = kvb[size_t(li)].uv_pairs.data<uint32_t>();
        k::gemm_bf16(gp);
      }
      bf16* ao = attn.get(T * hid);
      split_linears({{&L.o, ao}}, Act{oc}, T, "attn.o");
      return ao;
    }
    return nullptr;
  }

  // ---- FFN ------------------------------------------------------------------------------------

  // Whether the ranks split a dense FFN among them (dense_mlp_split): several ranks, all three
  // projections fp8 (a bf16 one keeps the replicated mlp()), and batch-invariant GEMMs
  // (DEEPINFER_BATCH_INVARIANT, docs/numerics.md §10): the split's GEMMs take every rank's rows
  // at once, which without it could sum a row otherwise than its own rank's call would.
  bool splits_dense(const Mlp& m) const {
    return group.size() > 1 && m.gate.fp8() && m.up.fp8() && m.down.fp8() &&
           knobs().batch_invariant;
  }

  // Rows of fp8 codes [rows, n] and their 1×128 scales [rows, num_blocks(n)] packed as one byte
  // row each (codes, then scales), so one collective moves both; rb: the row stride (0: just
  // those bytes).
  static size_t packed_row_bytes(int64_t n) {
    return size_t(n) + size_t(k::num_blocks(n)) * sizeof(float);
  }
  static void pack_rows(const fp8_e4m3* q, const float* s, int64_t rows, int64_t n, uint8_t* out,
                        size_t rb = 0) {
    const size_t nb = size_t(k::num_blocks(n));
    if (rb == 0) rb = packed_row_bytes(n);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(out + size_t(r) * rb, q + r * n, size_t(n));
      std::memcpy(out + size_t(r) * rb + size_t(n), s + size_t(r) * nb, nb * sizeof(float));
    }
  }
  // pack_rows's inverse.
  static void unpack_rows(const uint8_t* in, int64_t rows, int64_t n, fp8_e4m3* q, float* s,
                          size_t rb = 0) {
    const size_t nb = size_t(k::num_blocks(n));
    if (rb == 0) rb = packed_row_bytes(n);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(q + r * n, in + size_t(r) * rb, size_t(n));
      std::memcpy(s + size_t(r) * nb, in + size_t(r) * rb + size_t(n), nb * sizeof(float));
    }
  }

  // The dense FFN with W > 1 ranks: each rank computes a slice of it for every rank's rows rather
  // than all of it for its own, so the ranks read its weights once between them, not W times
  // (at decode each rank's few rows would read all 3·hidden·intermediate bytes alone:
  // docs/performance.md §8). Every rank gets every rank's input rows (all_gather_v of the fp8
  // cast), computes its slice of the gate and up columns (whole 128-blocks) and their SwiGLU and
  // cast, the slices are gathered into whole intermediate rows, each rank computes its slice of
  // the down projection's columns, and those go back to their rows' ranks (all_to_all_v). Every
  // column of a slice sums as in the whole GEMM and the 1×128 casts are per block, so out is bit
  // for bit what mlp() gives (EP sizes agree, docs/numerics.md §10). Every rank joins, T = 0 too.
  void dense_mlp_split(const Mlp& m, const fp8_e4m3* xq8, const float* xs8, int64_t T, bf16* out) {
    const int64_t hid = m.gate.in, I = m.gate.out, W = group.size(), me = group.rank();
    // Every rank's input rows, in rank order.
    std::vector<int64_t> rows;
    const int64_t total = gather_fp8_rows(xq8, xs8, T, hid, rows, "mlp");
    if (total == 0) return;
    const fp8_e4m3* aq = split_q.v.data();
    const float* as = split_s.v.data();
    // This rank's gate/up columns [i0, i1), SwiGLU and its cast.
    const auto [i0, i1] = rank_columns(I, me, W);
    const int64_t wi = i1 - i0, kbw = k::num_blocks(wi);
    fp8_e4m3* hq = tq.get(total * wi);
    float* hs = ts.get(total * kbw);
    if (wi > 0) {
      bf16* g = gbuf.get(total * wi);
      bf16* u = ubuf.get(total * wi);
      gemms_.clear();
      gemms_.push_back(fp8_gemm(column_slice(m.gate, i0, i1), aq, as, total, g));
      gemms_.push_back(fp8_gemm(column_slice(m.up, i0, i1), aq, as, total, u));
      k::gemm_fp8_multi(gemms_);
      swiglu(g, u, total, wi, hq, hs);
    }
    // Whole intermediate rows: every rank's column slice of every row.
    const size_t hb = packed_row_bytes(wi);
    uint8_t* send = split_send.get(int64_t(size_t(total) * hb));
    pack_rows(hq, hs, total, wi, send);
    std::vector<size_t> counts(static_cast<size_t>(W));
    size_t gathered = 0;
    for (int64_t q = 0; q < W; ++q) {
      const auto [q0, q1] = rank_columns(I, q, W);
      counts[size_t(q)] = size_t(total) * packed_row_bytes(q1 - q0);
      gathered += counts[size_t(q)];
    }
    uint8_t* inter = split_recv.get(int64_t(gathered));
    {
      k::KernelTag tag("mlp.gather", k::ScopeKind::collective);
      group.all_gather_v(send, size_t(total) * hb, inter, counts, DType::u8);
    }
    const int64_t kbi = k::num_blocks(I);
    fp8_e4m3* iq = xq.get(total * I);
    float* is = xs.get(total * kbi);
    for (int64_t q = 0, at = 0; q < W; ++q) {
      const auto [q0, q1] = rank_columns(I, q, W);
      const int64_t wq = q1 - q0, nbq = k::num_blocks(wq);
      const size_t rb = packed_row_bytes(wq);
      for (int64_t r = 0; r < total; ++r) {
        const uint8_t* src = inter + at + size_t(r) * rb;
        std::memcpy(iq + r * I + q0, src, size_t(wq));
        std::memcpy(is + r * kbi + q0 / 128, src + wq, size_t(nbq) * sizeof(float));
      }
      at += int64_t(counts[size_t(q)]);
    }
    // This rank's down columns [h0, h1) for every row, then each rank's rows back to it.
    const auto [h0, h1] = rank_columns(hid, me, W);
    const int64_t wh = h1 - h0;
    bf16* part = t1.get(total * wh);  // [total, wh], rows in rank order
    if (wh > 0) k::gemm_fp8(fp8_gemm(column_slice(m.down, h0, h1), iq, is, total, part));
    return_rows(part, rows, T, hid, DType::bf16, gath, out, "mlp");
  }

  // Where a MoE layer's shared expert runs: rank, or -1 for each rank on its own rows
  // (shared_expert_rank); else all `total` rows, this rank's starting at row `first`.
  struct SharedPlan {
    int rank = -1;
    int64_t total = 0, first = 0;
  };

  // Gathers every rank's fp8 rows (q, s) with their routed experts (idx [T, K]) and plans the
  // shared expert; the chosen rank keeps the rows in shared_q / shared_s. Every rank joins, with
  // T = 0 too.
  SharedPlan plan_shared(const LayerWeights& L, int64_t T, const int64_t* idx, const fp8_e4m3* q,
                         const float* s) {
    if (!splits_small_steps() || !L.has_shared || !L.shared.gate.fp8() || !L.shared.up.fp8() ||
        !L.shared.down.fp8())
      return {};
    const int64_t hid = cfg.hidden_size, K = cfg.num_experts_per_tok;
    const size_t xb = packed_row_bytes(hid), rb = xb + size_t(K) * sizeof(int32_t);
    uint8_t* send = split_send.get(int64_t(size_t(T) * rb));
    pack_rows(q, s, T, hid, send, rb);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = int32_t(idx[t * K + j]);
        std::memcpy(send + size_t(t) * rb + xb + size_t(j) * sizeof(int32_t), &e, sizeof(e));
      }
    std::vector<int64_t> rows;
    const uint8_t* all =
        gather_rows(send, T, int64_t(rb), DType::u8, split_recv, rows, "moe.shared", kMaxSplitRows);
    if (all == nullptr) return {};
    SharedPlan plan;
    for (int64_t r = 0; r < group.size(); ++r) {
      if (r < group.rank()) plan.first += rows[size_t(r)];
      plan.total += rows[size_t(r)];
    }
    std::vector<int32_t> ids(size_t(plan.total * K));
    for (int64_t r = 0; r < plan.total; ++r)
      std::memcpy(ids.data() + r * K, all + size_t(r) * rb + xb, size_t(K) * sizeof(int32_t));
    plan.rank = shared_expert_rank(ids, rows, cfg.n_routed_experts, K);
    if (plan.rank == group.rank())
      unpack_rows(all, plan.total, hid, shared_q.get(plan.total * hid),
                  shared_s.get(plan.total * k::num_blocks(hid)), rb);
    return plan;
  }

  // Returns the dense FFN's or the MoE's output [T, hidden] bf16 for the sub-layer input hbuf
  // (null when T = 0); every rank joins the MoE layer's collectives, with T = 0 too.
  const bf16* ffn(int64_t li, int64_t T, const bf16* hbuf, RoutingTrace* trace) {
    const LayerWeights& L = w->layers[size_t(li)];
    const int64_t hid = cfg.hidden_size;
    bf16* x = xn.get(T * hid);
    fp8_e4m3* xq8 = xq.get(T * hid);
    float* xs8 = xs.get(T * k::num_blocks(hid));
    bf16* out = ffn_out.get(T * hid);
    if (!L.moe) {
      k::KernelTag tag("mlp");
      rms_norm(hbuf, L.post_attn_norm, T, hid, x, 0, 0, xq8, xs8);
      if (splits_dense(L.dense))
        dense_mlp_split(L.dense, xq8, xs8, T, out);
      else
        mlp(L.dense, Act{x, xq8, xs8}, T, out);
      return T > 0 ? out : nullptr;
    }
    // The fp8 activations go where dispatch reads them in place (on mpi's direct lowering, the
    // shared window). combine_input reuses that place: the shared experts read x first, and x is
    // dropped before combine_input (EPBuffer throws while a tensor of it is alive).
    Tensor x_dispatch;
    if (fp8_experts) {
      x_dispatch = ep->dispatch_input(T);
      xq8 = x_dispatch.data<fp8_e4m3>();
    }
    const int64_t E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
    int64_t* idx = topk_idx.get(T * K);
    float* wts = topk_w.get(T * K);
    float* mg = margins.get(T);
    {
      k::KernelTag tag("moe.router");
      rms_norm(hbuf, L.post_attn_norm, T, hid, x, 0, 0, xq8, xs8);
      if (T > 0) {
        float* lg = router_logits.get(T * E);
        k::GemmBf16Params gp;
        gp.a = x;
        gp.w = L.router.w_bf16;
        gp.out_f32 = lg;
        gp.m = T;
        gp.n = E;
        gp.k = hid;
        k::gemm_bf16(gp);  // [T, E] f32
        k::RouterParams rp;
        rp.logits = lg;
        rp.bias = L.router_bias;
        rp.topk_idx = idx;
        rp.topk_weights = wts;
        rp.margins = mg;
        rp.num_tokens = T;
        rp.num_experts = E;
        rp.top_k = K;
        rp.n_group = cfg.n_group;
        rp.topk_group = cfg.topk_group;
        rp.scoring = cfg.scoring_func == ScoringFunc::sigmoid ? k::ScoringFunc::sigmoid
                                                              : k::ScoringFunc::softmax;
        rp.method = cfg.topk_method == TopkMethod::noaux_tc ? k::TopkMethod::noaux_tc
                    : cfg.topk_method == TopkMethod::greedy ? k::TopkMethod::greedy
                                                            : k::TopkMethod::group_limited_greedy;
        rp.norm_topk_prob = cfg.norm_topk_prob;
        rp.routed_scaling_factor = float(cfg.routed_scaling_factor);
        k::router(rp);
      }
    }
    if (trace) {
      trace->layers.push_back(li);
      trace->topk.emplace_back(idx, idx + T * K);
      trace->margins.emplace_back(mg, mg + T);
    }
    // One rank may run the shared expert for every rank's rows (docs/ep.md §14).
    const SharedPlan sp = plan_shared(L, T, idx, xq8, xs8);
    if (trace) trace->shared_rank.push_back(sp.rank);
    // Dispatch (every rank joins, T may be 0).
    DispatchInput din;
    const int64_t P = k::num_blocks(hid);
    if (fp8_experts) {
      din.x = Tensor::borrow(xq8, DType::e4m3, {T, hid});
      din.scales = Tensor::borrow(xs8, DType::f32, {T, P});
    } else {
      din.x = Tensor::borrow(x, DType::bf16, {T, hid});
    }
    din.topk_idx = Tensor::borrow(idx, DType::i64, {T, K});
    din.topk_weights = Tensor::borrow(wts, DType::f32, {T, K});
    DispatchOutput dout;
    {
      k::KernelTag tag("moe.dispatch", k::ScopeKind::collective);
      dout = ep->dispatch(din);
    }
    // Gate and up of the shared expert (it reads x, in the dispatch input: before x_dispatch is
    // dropped) and of every local expert over its segment of the expand layout, in one stage.
    const int64_t S = dout.x.dim(0);
    std::vector<MlpJob>& jobs = moe_jobs;
    jobs.clear();
    if (sp.rank < 0 && L.has_shared && T > 0) jobs.push_back({&L.shared, Act{x, xq8, xs8}, T});
    if (sp.rank == group.rank())
      jobs.push_back({&L.shared, Act{nullptr, shared_q.v.data(), shared_s.v.data()}, sp.total});
    int64_t off = 0;
    for (size_t e = 0; e < dout.num_recv_tokens_per_expert_aligned.size(); ++e) {
      const int64_t n = dout.num_recv_tokens_per_expert_aligned[e];
      if (n == 0) continue;
      Act a;
      if (fp8_experts) {
        a.q = dout.x.data<fp8_e4m3>() + off * hid;
        a.scales = dout.scales.data<float>() + off * P;
      } else {
        a.x = dout.x.data<bf16>() + off * hid;
      }
      jobs.push_back({&L.experts[e], a, n});
      off += n;
    }
    DI_CHECK(off == S, "expand layout: {} rows in expert segments, {} received", off, S);
    {
      k::KernelTag tag("moe.experts");
      mlp_up(jobs);
    }
    din = {};
    x_dispatch = {};
    xq8 = nullptr;
    // [S, hid] expert outputs in the expand layout, written where combine reads them (on mpi's
    // direct lowering, the shared window: no copy there).
    Tensor y_out = ep->combine_input(dout.handle);
    bf16* y = y_out.data<bf16>();
    bf16* shared = sp.rank >= 0            ? shared_out.get(sp.total * hid)
                   : L.has_shared && T > 0 ? shared_out.get(T * hid)
                                           : nullptr;
    off = 0;
    for (MlpJob& j : jobs) {
      if (j.m == &L.shared) {
        j.out = shared;
      } else {
        j.out = y + off * hid;
        off += j.rows;
      }
    }
    {
      k::KernelTag tag("moe.experts");
      mlp_down(jobs);
    }
    if (sp.rank >= 0) {
      k::KernelTag tag("moe.shared.broadcast", k::ScopeKind::collective);
      group.broadcast(shared, size_t(sp.total * hid), DType::bf16, sp.rank);
      shared = T > 0 ? shared + sp.first * hid : nullptr;
    }
    CombineOutput cout_;
    {
      k::KernelTag tag("moe.combine", k::ScopeKind::collective);
      cout_ = ep->combine(y_out, dout.handle);
    }
    if (T == 0) return nullptr;
    const bf16* routed = cout_.x.data<bf16>();  // [T, hid] bf16(Σ_k w_k·y_k)
    if (shared) {
      residual_add(routed, shared, out, T * hid);  // bf16(routed + shared)
    } else {
      std::memcpy(out, routed, size_t(T * hid) * sizeof(bf16));
    }
    return out;
  }

  // Checks the chunks, reserves their cache rows; returns the number of new tokens.
  int64_t begin_forward(const std::vector<SeqChunk>& chunks, PagedKvCache& cache) {
    int64_t T = 0;
    for (const auto& c : chunks) {
      DI_CHECK(c.num_tokens >= 0 && c.start_pos >= 0, "bad chunk: {} tokens at position {}",
               c.num_tokens, c.start_pos);
      T += c.num_tokens;
    }
    DI_CHECK(T <= opts.max_tokens_per_step, "forward: {} tokens exceed max_tokens_per_step {}", T,
             opts.max_tokens_per_step);
    for (const auto& c : chunks) cache.reserve(c.cache_seq, c.start_pos + c.num_tokens);
    return T;
  }

  // dst [T, hid] (row stride `stride`, 0 = hid) = embedding rows of the chunks' tokens.
  void embed(const std::vector<SeqChunk>& chunks, bf16* dst, int64_t stride = 0) {
    const int64_t hid = cfg.hidden_size, V = cfg.vocab_size;
    if (stride == 0) stride = hid;
    k::KernelTag tag("embed");
    int64_t t = 0;
    for (const auto& c : chunks)
      for (int64_t j = 0; j < c.num_tokens; ++j, ++t) {
        const int32_t id = c.tokens[j];
        DI_CHECK(id >= 0 && id < V, "token id {} out of range [0, {})", id, V);
        std::memcpy(dst + t * stride, w->embed + int64_t(id) * hid, size_t(hid) * sizeof(bf16));
      }
  }

  // ---- the residual stream and mHC (docs/engram.md §2) ---------------------------------------

  // The residual stream [T, hc, hidden] bf16 (hc = 1: the plain hidden state). mhc_post writes a
  // new stream (it may not alias the old one), so two buffers take turns.
  struct Stream {
    bf16* cur = nullptr;
    bf16* alt = nullptr;
  };

  // The sub-layer's input: the stream itself (hc = 1), or mhc_pre's mix of its branches (post and
  // comb kept for sublayer_out).
  const bf16* sublayer_in(const MhcWeights& m, int64_t T, const Stream& s, const char* tag) {
    if (hc == 1 || T == 0) return s.cur;
    const int64_t hid = cfg.hidden_size;
    k::KernelTag kt(tag);
    k::MhcPreParams p;
    p.residual = s.cur;
    p.fn = m.fn;
    p.scale = m.scale;
    p.base = m.base;
    p.x = mhc_x.get(T * hid);
    p.post = mhc_post_w.get(T * hc);
    p.comb = mhc_comb.get(T * hc * hc);
    p.num_tokens = T;
    p.hc = hc;
    p.dim = hid;
    p.rms_eps = p.pre_eps = p.sinkhorn_eps = float(cfg.hc_eps);
    p.post_mult = float(cfg.hc_post_mult);
    p.sinkhorn_repeat = cfg.hc_sinkhorn_repeat;
    k::mhc_pre(p);         // x [T, hid], post [T, hc], comb [T, hc, hc]
    if (opts.ablate_comb)  // the evidence knob: every comb the identity
      for (int64_t t = 0; t < T; ++t)
        for (int64_t a = 0; a < hc; ++a)
          for (int64_t b = 0; b < hc; ++b) p.comb[(t * hc + a) * hc + b] = a == b ? 1.0f : 0.0f;
    return p.x;
  }

  // The stream after a sub-layer with output y [T, hidden]: R + y (hc = 1), or mhc_post's mix.
  void sublayer_out(const bf16* y, int64_t T, Stream& s, const char* tag) {
    if (T == 0) return;
    const int64_t hid = cfg.hidden_size;
    if (hc == 1) {
      residual_add(s.cur, y, s.cur, T * hid);
      return;
    }
    k::KernelTag kt(tag);
    k::MhcPostParams p;
    p.y = y;
    p.residual = s.cur;
    p.post = mhc_post_w.get(T * hc);
    p.comb = mhc_comb.get(T * hc * hc);
    p.out = s.alt;
    p.num_tokens = T;
    p.hc = hc;
    p.dim = hid;
    k::mhc_post(p);  // [T, hc, hid]
    std::swap(s.cur, s.alt);
  }

  // ---- Engram (docs/engram.md §1, §3) ---------------------------------------------------------

  // This rank's rows of the one table of all Engram layers, written into the EngramBuffer: global
  // row g (layer l's row r is g = row_base[l] + r) lives on rank g / n, n = ceil(rows / W). Each
  // rank copies only its own rows out of the mapped checkpoint.
  void engram_setup() {
    const EngramWeights& ew = w->engram;
    const int64_t D = cfg.engram.head_dim(), W = group.size(), rank = group.rank();
    EngramConfig ec;
    ec.hidden = int(D);
    ec.dtype = EngramDType::bf16;
    ec.algo = opts.engram_algo;
    engram_buf = std::make_unique<EngramBuffer>(group, ec);
    const int64_t n = std::max<int64_t>(1, (ew.total_rows + W - 1) / W);
    const int64_t lo = rank * n, hi = std::min(ew.total_rows, lo + n);
    Tensor shard = Tensor::zeros(DType::bf16, {n, D});  // [n, D], rows past the table stay zero
    for (size_t l = 0; l < ew.layers.size(); ++l) {
      const int64_t base = ew.row_base[l], end = base + ew.hash.rows[l];
      const int64_t a = std::max(lo, base), b = std::min(hi, end);
      if (a < b)
        std::memcpy(shard.data<bf16>() + (a - lo) * D, ew.layers[l].table + (a - base) * D,
                    size_t((b - a) * D) * sizeof(bf16));
    }
    engram_buf->write(shard);
    log_debug("Engram: rank {} holds rows [{}, {}) of {} ({:.2f} MiB)", rank, lo, hi, ew.total_rows,
              double(shard.nbytes()) / double(1 << 20));
  }

  // At the start of a forward: the canonical ids of its tokens go to the cache, every token's
  // n-gram window (pad before the sequence start) is hashed for all Engram layers in one call, and
  // the fetches of the blocks 0 and 1 start.
  void engram_begin(const std::vector<SeqChunk>& chunks, PagedKvCache& cache, int64_t T) {
    const EngramModelConfig& g = cfg.engram;
    const EngramWeights& ew = w->engram;
    const int64_t G = g.max_ngram_size, H = g.heads(), Le = g.num_layers();
    for (const auto& c : chunks)
      for (int64_t j = 0; j < c.num_tokens; ++j)
        cache.token_id(c.cache_seq, c.start_pos + j) =
            ew.compression->canonical(c.tokens[j], g.pad_id);
    int32_t* ids = eg_ids.get(T * G);  // [T, G]: column k = the canonical id of token t - k
    int64_t t = 0;
    for (const auto& c : chunks)
      for (int64_t j = 0; j < c.num_tokens; ++j, ++t)
        for (int64_t kk = 0; kk < G; ++kk) {
          const int64_t q = c.start_pos + j - kk;
          ids[t * G + kk] = q < 0 ? ew.pad_canonical : cache.token_id(c.cache_seq, q);
        }
    int32_t* idx = eg_idx.get(Le * T * H);  // [Le, T, H] rows of the one table
    if (T > 0) {
      k::KernelTag tag("engram");
      k::EngramHashParams p;
      p.ngram_ids = ids;
      p.multipliers = ew.hash.multipliers.data();
      p.vocab_sizes = ew.hash.vocab_sizes.data();
      p.offsets = ew.hash.offsets.data();
      p.out = idx;
      p.num_tokens = T;
      p.num_layers = Le;
      p.max_ngram = G;
      p.heads_per_ngram = g.n_head_per_ngram;
      k::engram_hash(p);
    }
    eg_fetch.assign(size_t(Le), EngramFetch{});
    for (int64_t e = 0; e < Le; ++e)
      if (g.layer_ids[size_t(e)] <= 1) engram_start_fetch(e, T);
  }

  // Collective: the rows of Engram layer e's T tokens (every rank, T may be 0).
  void engram_start_fetch(int64_t e, int64_t T) {
    const int64_t H = cfg.engram.heads();
    k::KernelTag tag(fmt::format("layer{}.engram.fetch", cfg.engram.layer_ids[size_t(e)]),
                     k::ScopeKind::collective);
    eg_fetch[size_t(e)] =
        engram_buf->start_fetch(Tensor::borrow(eg_idx.v.data() + e * T * H, DType::i32, {T, H}));
  }

  // The Engram block of layer e on the stream [T, hc, hid]: value and keys from the fetched rows,
  // the gate into each branch, the short conv (its input rows kept per position in the cache)
  // with SiLU, added to the gated branches.
  void engram_block(int64_t e, const std::vector<SeqChunk>& chunks, PagedKvCache& cache, int64_t T,
                    Stream& s) {
    EngramResult rows = eg_fetch[size_t(e)].wait();
    if (T == 0) return;
    k::KernelTag tag("engram");
    const EngramModelConfig& g = cfg.engram;
    const EngramLayerWeights& W = w->engram.layers[size_t(e)];
    const int64_t hid = cfg.hidden_size, E = g.embed_dim(), C = hc * hid, K = g.kernel_size,
                  dil = g.dilation(), hist = g.conv_history();
    bf16* emb = rows.data.data<bf16>();  // [T, E]: the H rows of each token side by side
    if (opts.ablate_engram) std::fill(emb, emb + T * E, bf16{});
    float* f = eg_f32.get(T * C);
    bf16* v = eg_v.get(T * hid);  // [T, hid] = bf16(e·W_vᵀ + b_v)
    bf16* kk = eg_k.get(T * C);   // [T, hc, hid] = bf16(e·W_k,iᵀ + b_k,i)
    project(emb, W.value.w_bf16, W.value_bias, T, hid, E, f, v);
    project(emb, W.keys.data<bf16>(), W.key_bias.data<bf16>(), T, C, E, f, kk);
    bf16* gated = eg_gated.get(T * C);
    float* gate = eg_gate.get(T * hc);
    {
      k::EngramGateParams p;
      p.x = s.cur;
      p.k = kk;
      p.v = v;
      p.w_fused = W.w_fused.data<float>();
      p.out = gated;  // [T, hc, hid] bf16(R_i + g_i·v)
      p.gate = gate;  // [T, hc]
      p.num_tokens = T;
      p.hc = hc;
      p.dim = hid;
      p.eps = float(cfg.rms_norm_eps);
      p.clamp = kEngramGateClamp;
      k::engram_gate(p);
    }
    // The conv's input rows; this forward's rows go to the cache for the positions after it.
    const int64_t hist_rows = [&] {
      int64_t n = 0;
      for (const auto& c : chunks)
        if (c.num_tokens > 0) n += std::min(hist, c.start_pos);
      return n;
    }();
    bf16* win = eg_win.get((T + hist_rows) * C);  // [T + hist_rows, C]: new rows, then history
    {
      k::EngramConvNormParams p;
      p.v = v;
      p.gate = gate;
      p.w = W.conv_norm.data<bf16>();
      p.out = win;  // [T, hc, hid] bf16(RMSNorm(bf16(g_i·v))·w_i)
      p.num_tokens = T;
      p.hc = hc;
      p.dim = hid;
      p.eps = kShortConvNormEps;
      k::engram_conv_norm(p);
    }
    int32_t* taps = eg_taps.get(T * K);  // [T, K]: the row of win each tap reads, -1 = zero
    int64_t t = 0, h = T;
    for (const auto& c : chunks) {
      if (c.num_tokens == 0) continue;
      const int64_t h0 = std::max<int64_t>(0, c.start_pos - hist), first = t, hbase = h;
      for (int64_t q = h0; q < c.start_pos; ++q, ++h)
        std::memcpy(win + h * C, cache.conv_row(e, c.cache_seq, q), size_t(C) * sizeof(bf16));
      for (int64_t j = 0; j < c.num_tokens; ++j, ++t) {
        const int64_t p = c.start_pos + j;
        std::memcpy(cache.conv_row(e, c.cache_seq, p), win + t * C, size_t(C) * sizeof(bf16));
        for (int64_t tap = 0; tap < K; ++tap) {
          const int64_t q = p - (K - 1 - tap) * dil;
          taps[t * K + tap] = int32_t(q < 0              ? -1
                                      : q >= c.start_pos ? first + (q - c.start_pos)
                                                         : hbase + (q - h0));
        }
      }
    }
    bf16* sc = eg_s.get(T * C);
    {
      k::EngramShortConvParams p;
      p.x = win;
      p.taps = taps;
      p.w = W.conv_w;
      p.out = sc;  // [T, C] bf16(SiLU(conv))
      p.num_tokens = T;
      p.num_rows = T + hist_rows;
      p.channels = C;
      p.kernel_size = K;
      k::engram_short_conv(p);
    }
    residual_add(gated, sc, s.cur, T * C);  // R_i = bf16(gated_i + s_i)
  }

  // out [T, n] = bf16(x·Wᵀ + b): exact BF16 GEMM into f32 (scratch f), then the bias, one
  // rounding; exact because these rows feed the rounding-sensitive stream (docs/numerics.md §8.1).
  void project(const bf16* x, const bf16* wt, const bf16* bias, int64_t T, int64_t n, int64_t kdim,
               float* f, bf16* out) {
    k::GemmBf16Params gp;
    gp.a = x;
    gp.w = wt;
    gp.out_f32 = f;
    gp.m = T;
    gp.n = n;
    gp.k = kdim;
    gp.exact = true;
    k::gemm_bf16(gp);
    k::BiasAddParams bp;
    bp.x = f;
    bp.bias = bias;
    bp.out = out;
    bp.rows = T;
    bp.cols = n;
    k::bias_add(bp);
  }

  // ---- blocks ---------------------------------------------------------------------------------

  // Layer li on the stream: Engram (if the layer has it), then attention and the FFN, each
  // through mHC when hc_mult > 1. The next Engram layer's fetch starts after this attention.
  // With `kept` (kept_rows; plain blocks only) every row's latent goes to the cache and the
  // stream goes on with the kept rows. Returns the stream's rows.
  int64_t block(int64_t li, const std::vector<SeqChunk>& chunks, PagedKvCache& cache, int64_t T,
                Stream& s, RoutingTrace* trace, const std::vector<SeqChunk>* kept = nullptr) {
    const LayerWeights& L = w->layers[size_t(li)];
    DI_CHECK(!kept || (L.engram < 0 && hc == 1),
             "block {}: only a plain block runs some rows for the cache alone", li);
    if (L.engram >= 0) engram_block(L.engram, chunks, cache, T, s);
    {
      const bf16* x = sublayer_in(L.attn_hc, T, s, "mhc.attn");
      const bf16* y;
      {
        k::KernelTag tag("attn");
        y = attention(li, chunks, cache, T, x, kept);
      }
      if (kept) T = compact_rows(s.cur, cfg.hidden_size, chunks, *kept);
      sublayer_out(y, T, s, "mhc.attn");
    }
    if (li + 1 < cfg.num_hidden_layers && li + 1 >= 2 && w->layers[size_t(li + 1)].engram >= 0)
      engram_start_fetch(w->layers[size_t(li + 1)].engram, T);
    const bf16* x = sublayer_in(L.ffn_hc, T, s, "mhc.ffn");
    sublayer_out(ffn(li, T, x, trace), T, s, "mhc.ffn");
    return T;
  }

  // Norm + head on the rows that need logits (per chunk: all its positions or its last); the
  // hidden rows are kept in out.hidden when asked.
  // vocab: the logits of the first `vocab` ids only (an MTP draft vocabulary), 0 = all.
  void head(const std::vector<SeqChunk>& chunks, const bf16* hb, int64_t T, const bf16* norm,
            const Linear& lm, bool keep_hidden, ForwardOutput& out, int64_t vocab = 0) {
    const int64_t hid = cfg.hidden_size, V = vocab > 0 ? vocab : cfg.vocab_size;
    if (keep_hidden) {
      out.hidden = Tensor::empty(DType::bf16, {T, hid});
      if (T > 0) std::memcpy(out.hidden.data<bf16>(), hb, size_t(T * hid) * sizeof(bf16));
    }
    out.row_begin.push_back(0);
    std::vector<int64_t> rows;
    {
      int64_t t = 0;
      for (const auto& c : chunks) {
        if (c.all_logits)
          for (int64_t j = 0; j < c.num_tokens; ++j) rows.push_back(t + j);
        else if (c.num_tokens > 0)
          rows.push_back(t + c.num_tokens - 1);
        t += c.num_tokens;
        out.row_begin.push_back(int64_t(rows.size()));
      }
    }
    const int64_t R = int64_t(rows.size());
    out.logits = Tensor::empty(DType::f32, {R, V});
    k::KernelTag tag("head");
    bf16* gn = head_in.get(R * hid);
    if (R > 0) {
      bf16* g = gath.get(R * hid);
      for (int64_t i = 0; i < R; ++i)
        std::memcpy(g + i * hid, hb + rows[size_t(i)] * hid, size_t(hid) * sizeof(bf16));
      rms_norm(g, norm, R, hid, gn);
    }
    head_logits(gn, R, lm, V, out.logits.data<float>());
  }

  // Output columns [c0, c1) of l as a linear of its own (c0 % 128 == 0: whole scale blocks and
  // decode-layout panels). Each of its columns sums exactly as the same column of l: the GEMMs'
  // order depends on K only (docs/numerics.md §10).
  static Linear column_slice(const Linear& l, int64_t c0, int64_t c1) {
    Linear c;
    c.name = l.name;
    c.in = l.in;
    c.out = c1 - c0;
    if (l.w_fp8) c.w_fp8 = l.w_fp8 + c0 * l.in;
    if (l.w_scale) c.w_scale = l.w_scale + (c0 / 128) * k::num_blocks(l.in);
    if (l.w_bf16)  // from the rank's copy of its slice where that holds the columns
      c.w_bf16 = l.w_slice && c0 >= l.slice.first && c1 <= l.slice.second
                     ? l.w_slice + (c0 - l.slice.first) * l.in
                     : l.w_bf16 + c0 * l.in;
    if (l.w_decode) c.w_decode = l.w_decode + k::decode_layout_bytes(c0, l.in);
    return c;
  }

  // Every rank's T rows of `width` elements x, gathered in rank order (all_gather_v) into buf;
  // rows[q] is rank q's row count. Returns them, or null (nothing gathered) where no rank has
  // rows or they are more than max_total. Every rank joins, with T = 0 too. what: the profile
  // scope's prefix.
  template <class E>
  E* gather_rows(const E* x, int64_t T, int64_t width, DType dtype, Scratch<E>& buf,
                 std::vector<int64_t>& rows, const std::string& what,
                 int64_t max_total = std::numeric_limits<int64_t>::max()) {
    const int64_t W = group.size();
    rows.assign(size_t(W), 0);
    k::KernelTag tag(what + ".gather", k::ScopeKind::collective);
    group.all_gather(&T, rows.data(), 1, DType::i64);
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    if (total == 0 || total > max_total) return nullptr;
    std::vector<size_t> counts(static_cast<size_t>(W));
    for (int64_t q = 0; q < W; ++q) counts[size_t(q)] = size_t(rows[size_t(q)] * width);
    E* all = buf.get(total * width);
    group.all_gather_v(x, size_t(T * width), all, counts, dtype);
    return all;
  }

  // The way back from gather_rows for a column split of n columns (rank_columns): part holds this
  // rank's columns of every rank's rows (rows in rank order); each rank gets its T rows back with
  // all n columns in out [T, n] (all_to_all_v, then the slices interleaved). Every rank joins.
  template <class E>
  void return_rows(const E* part, const std::vector<int64_t>& rows, int64_t T, int64_t n,
                   DType dtype, Scratch<E>& buf, E* out, const std::string& what) {
    const int64_t W = group.size();
    const auto [m0, m1] = rank_columns(n, group.rank(), W);
    std::vector<size_t> counts(static_cast<size_t>(W)), back(static_cast<size_t>(W));
    for (int64_t q = 0; q < W; ++q) {
      const auto [q0, q1] = rank_columns(n, q, W);
      counts[size_t(q)] = size_t(rows[size_t(q)] * (m1 - m0));
      back[size_t(q)] = size_t(T * (q1 - q0));
    }
    E* got = buf.get(T * n);  // from rank q: [T, its columns]
    {
      k::KernelTag tag(what + ".exchange", k::ScopeKind::collective);
      group.all_to_all_v(part, counts, got, back, dtype);
    }
    for (int64_t q = 0, at = 0; q < W; ++q) {
      const auto [q0, q1] = rank_columns(n, q, W);
      for (int64_t r = 0; r < T; ++r)
        std::memcpy(out + r * n + q0, got + at + r * (q1 - q0), size_t(q1 - q0) * sizeof(E));
      at += T * (q1 - q0);
    }
  }

  // out [T, v1 - v0] f32 = the LM head's columns [v0, v1) for rows x [T, hidden] (v0 % 128 == 0).
  void head_columns(const bf16* x, int64_t T, const Linear& lm, int64_t v0, int64_t v1,
                    float* out) {
    const int64_t hid = cfg.hidden_size;
    if (T == 0 || v1 <= v0) return;
    const Linear slice = column_slice(lm, v0, v1);
    if (lm.fp8()) {  // LoadOptions::fp8_head
      fp8_e4m3* q = tq.get(T * hid);
      float* s = ts.get(T * k::num_blocks(hid));
      quantize(x, T, hid, q, s);
      k::GemmFp8Params p = fp8_gemm(slice, q, s, T, nullptr);
      p.out_f32 = out;
      k::gemm_fp8(p);
    } else {
      k::GemmBf16Params gp;
      gp.a = x;
      gp.w = slice.w_bf16;
      gp.out_f32 = out;
      gp.m = T;
      gp.n = slice.out;
      gp.k = hid;
      k::gemm_bf16(gp);
    }
  }

  // logits [R, V] (the head's first V columns) for this rank's normed rows x [R, hidden]. With
  // several ranks the vocabulary is
  // split among them in slices of whole 128-column blocks: every rank computes its slice for every
  // rank's rows (all_gather_v of the rows) and the slices go back to their rows' ranks
  // (all_to_all_v), so a lone decoding sequence's head is read by every rank's threads, not by its
  // own rank's alone (docs/performance.md §8). Every rank joins, with R = 0 too. A logit is the
  // same sum on any rank: the GEMMs' row order depends on K only (docs/numerics.md §10).
  void head_logits(const bf16* x, int64_t R, const Linear& lm, int64_t V, float* logits) {
    const int64_t hid = cfg.hidden_size, W = group.size();
    if (W == 1) return head_columns(x, R, lm, 0, V, logits);
    std::vector<int64_t> rows;
    const bf16* all = gather_rows(x, R, hid, DType::bf16, head_rows, rows, "head");
    if (all == nullptr) return;
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const auto [v0, v1] = rank_columns(V, group.rank(), W);
    float* part = head_part.get(total * (v1 - v0));  // [total, v1 - v0], rows in rank order
    head_columns(all, total, lm, v0, v1, part);
    return_rows(part, rows, R, V, DType::f32, head_back, logits, "head");
  }

  ForwardOutput forward(const std::vector<SeqChunk>& chunks, PagedKvCache& cache, bool trace,
                        bool keep_hidden) {
    const int64_t T = begin_forward(chunks, cache), hid = cfg.hidden_size;
    Stream s{h.get(T * hc * hid), h_alt.get(T * hc * hid)};  // [T, hc, hid] residual stream
    embed(chunks, s.cur, hc * hid);
    for (int64_t t = 0; t < T; ++t)  // hc copies of the embedding row
      for (int64_t m = 1; m < hc; ++m)
        std::memcpy(s.cur + (t * hc + m) * hid, s.cur + t * hc * hid, size_t(hid) * sizeof(bf16));
    if (engram_buf) engram_begin(chunks, cache, T);
    ForwardOutput out;
    for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
      k::KernelTag ltag("layer" + std::to_string(li));
      block(li, chunks, cache, T, s, trace ? &out.routing : nullptr);
    }
    const bf16* hb = s.cur;
    if (hc > 1 && T > 0) {  // h = bf16(Σ_m h_m·R_m) feeds the final norm
      k::KernelTag tag("mhc.head");
      k::MhcHeadParams p;
      p.residual = s.cur;
      p.fn = w->hc_head.fn;
      p.scale = w->hc_head.scale;
      p.base = w->hc_head.base;
      p.out = s.alt;  // [T, hid]
      p.num_tokens = T;
      p.hc = hc;
      p.dim = hid;
      p.rms_eps = p.eps = float(cfg.hc_eps);
      k::mhc_head(p);
      hb = s.alt;
    }
    head(chunks, hb, T, w->final_norm, w->lm_head, keep_hidden, out);
    return out;
  }

  // h' = eh_proj([enorm(Emb(next token)) | hnorm(h)]), one block (layer num_hidden_layers),
  // shared_head.norm, the head.
  ForwardOutput mtp_forward(const std::vector<SeqChunk>& chunks, const bf16* hidden_in,
                            PagedKvCache& cache, int64_t vocab) {
    DI_CHECK(vocab >= 0 && vocab <= cfg.vocab_size,
             "mtp_forward: a draft vocabulary of {} ids, the model has {}", vocab, cfg.vocab_size);
    DI_CHECK(!w->mtp.empty(), "mtp_forward: the weights hold no MTP module (LoadOptions::mtp)");
    const MtpWeights& m = w->mtp[0];
    const int64_t hid = cfg.hidden_size, li = cfg.num_hidden_layers;
    const int64_t T = begin_forward(chunks, cache);
    k::KernelTag ltag("mtp");
    bf16* cat = ocat.get(T * 2 * hid);  // [T, 2·hid]: [enorm(e) | hnorm(h)]
    bf16* e = xn.get(T * hid);
    embed(chunks, e);
    {
      k::KernelTag tag("proj");
      rms_norm(e, m.enorm, T, hid, cat, 0, 2 * hid);
      rms_norm(hidden_in, m.hnorm, T, hid, cat + hid, 0, 2 * hid);
    }
    Stream s{h.get(T * hid), nullptr};  // the MTP module runs only where hc_mult = 1
    {
      k::KernelTag tag("proj");
      linear(m.eh_proj, Act{cat}, T, s.cur);
    }
    ForwardOutput out;
    // The catch-up rows before each chunk's last only write their latent to the cache.
    const std::vector<SeqChunk> kept = kept_rows(chunks);
    const int64_t Tk = block(li, chunks, cache, T, s, nullptr, &kept);
    head(kept, s.cur, Tk, m.head_norm, m.head, true, out, vocab);
    return out;
  }
};

ModelOptions ModelOptions::from_knobs() {
  ModelOptions o;
  o.ep = EPConfig::from_knobs();
  o.split_replicated = knobs().ep_split;
  return o;
}

int shared_expert_rank(std::span<const int32_t> topk_ids, std::span<const int64_t> rows,
                       int64_t num_experts, int64_t top_k) {
  const int64_t W = int64_t(rows.size());
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  DI_CHECK(W > 0 && num_experts % W == 0 && int64_t(topk_ids.size()) == total * top_k,
           "shared_expert_rank: {} ids for {} rows of top-{}, {} experts over {} ranks",
           topk_ids.size(), total, top_k, num_experts, W);
  if (W == 1 || total == 0) return -1;
  const int64_t L = num_experts / W;
  std::vector<int64_t> expert_rows(size_t(num_experts), 0);
  for (int32_t e : topk_ids) {
    DI_CHECK(e < num_experts, "shared_expert_rank: expert {} of {}", e, num_experts);
    if (e >= 0) ++expert_rows[size_t(e)];
  }
  std::vector<double> routed(size_t(W), 0.0);
  for (int64_t e = 0; e < num_experts; ++e)
    if (expert_rows[size_t(e)] > 0)
      routed[size_t(e / L)] += 1.0 + kSharedRowCost * double(expert_rows[size_t(e)]);
  double own = 0.0;  // the busiest rank's cost with every rank running its own rows
  for (int64_t q = 0; q < W; ++q)
    own = std::max(
        own, routed[size_t(q)] +
                 (rows[size_t(q)] > 0 ? 1.0 + kSharedRowCost * double(rows[size_t(q)]) : 0.0));
  const int64_t light = std::min_element(routed.begin(), routed.end()) - routed.begin();
  double balanced = routed[size_t(light)] + 1.0 + kSharedRowCost * double(total);
  for (int64_t q = 0; q < W; ++q)
    if (q != light) balanced = std::max(balanced, routed[size_t(q)]);
  return balanced <= own ? int(light) : -1;
}

DeepseekModel::DeepseekModel(std::shared_ptr<const ModelWeights> weights, Group& group,
                             const ModelOptions& opts)
    : impl_(std::make_unique<Impl>(std::move(weights), group, opts)) {}
DeepseekModel::~DeepseekModel() = default;

const ModelConfig& DeepseekModel::config() const { return impl_->cfg; }
const ModelWeights& DeepseekModel::weights() const { return *impl_->w; }

KvCacheConfig DeepseekModel::kv_cache_config(int64_t num_pages) const {
  KvCacheConfig c;
  c.num_layers = impl_->cfg.num_hidden_layers + int64_t(impl_->w->mtp.size());
  c.row_dim = impl_->cfg.kv_lora_rank + impl_->cfg.qk_rope_head_dim;
  c.num_pages = num_pages;
  c.page_size = k::kMlaPageSize;
  if (impl_->cfg.engram.enabled()) {
    c.conv_layers = impl_->cfg.engram.num_layers();
    c.conv_dim = impl_->cfg.hc_mult * impl_->cfg.hidden_size;
    c.token_ids = true;
  }
  return c;
}

ForwardOutput DeepseekModel::forward(const std::vector<SeqChunk>& chunks, PagedKvCache& cache,
                                     bool trace, bool hidden) {
  return impl_->forward(chunks, cache, trace, hidden);
}

bool DeepseekModel::has_mtp() const { return !impl_->w->mtp.empty(); }

ForwardOutput DeepseekModel::mtp_forward(const std::vector<SeqChunk>& chunks, const bf16* hidden,
                                         PagedKvCache& cache, int64_t draft_vocab) {
  return impl_->mtp_forward(chunks, hidden, cache, draft_vocab);
}

DecodeWeightBytes DeepseekModel::decode_weight_bytes() const {
  const auto& w = *impl_->w;
  const auto& c = w.config;
  DecodeWeightBytes d;
  for (size_t i = 0; i < size_t(c.num_hidden_layers); ++i) {  // the main layers (not MTP)
    const auto& L = w.layers[i];
    d.shared += double(L.q_a.weight_bytes() + L.q_b.weight_bytes() + L.q.weight_bytes() +
                       L.kv_a.weight_bytes() + L.o.weight_bytes());
    // The absorbed attention reads W_UK and W_UV once each (as w_uk_t and w_bf16's W_UV rows, or in
    // the pairs layout), not w_bf16's W_UK rows.
    const AbsorbedKvB& a = impl_->kvb[i];
    d.shared += !a.uk_pairs.defined() ? double(a.w_uk_t.nbytes()) + double(c.num_attention_heads) *
                                                                        double(c.v_head_dim) *
                                                                        double(c.kv_lora_rank) * 2
                                      : double(a.uk_pairs.nbytes() + a.uv_pairs.nbytes());
    d.shared += 2.0 * double(c.hidden_size) * 2;  // the two norms
    if (!L.moe) {
      d.shared += double(mlp_bytes(L.dense));
    } else {
      d.shared += double(L.router.weight_bytes());
      if (L.has_shared) d.shared += double(mlp_bytes(L.shared));
      ++d.moe_layers;
      if (!L.experts.empty()) d.routed_expert = double(mlp_bytes(L.experts[0]));
    }
  }
  d.shared += double(w.lm_head.weight_bytes()) + double(c.hidden_size) * 2;  // head, final norm
  d.per_token = double(c.hidden_size) * 2;                                   // the embedding row
  if (c.hc_mult > 1) {  // mHC: two mixings per layer and the head's, fp32
    const double hd = double(c.hc_mult * c.hidden_size) * 4;
    d.shared += double(c.num_hidden_layers) * 2 * double(c.hc_mult * (c.hc_mult + 2)) * hd +
                double(c.hc_mult) * hd;
  }
  for (const auto& e : w.engram.layers) {  // projections, norms, conv; the rows fetched per token
    d.shared += double(e.value.weight_bytes() + e.keys.nbytes() + e.key_bias.nbytes() +
                       e.w_fused.nbytes() + e.conv_norm.nbytes()) +
                double(c.hc_mult * c.hidden_size * c.engram.kernel_size) * 2;
    d.per_token += double(c.engram.embed_dim()) * 2;
  }
  return d;
}

double DeepseekModel::active_weight_bytes_per_token() const {
  const DecodeWeightBytes d = decode_weight_bytes();
  return d.step_bytes(1, double(d.moe_layers) * double(impl_->cfg.num_experts_per_tok));
}

}  // namespace deepinfer::model
