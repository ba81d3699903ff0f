#include <algorithm>
#include <functional>

#include "ep/allgather/ag.h"
#include "ep/combine_rows.h"

namespace deepinfer::ep::ag {
namespace {

using rows::canon;

struct ReduceParams {
  EpReduce reduce = EpReduce::rs;
  int64_t rows = 0;       // R rows per rank
  size_t cols = 0;        // floats per row
  size_t chunk_rows = 1;  // rows per rank per collective
};
// fill(begin, end, send): write rows [begin, end) of every rank's block into send [W, end-begin,
// cols], every float of it (zeros where the rank has nothing: send holds the previous chunk's
// bytes). consume(begin, end, own): this rank's summed rows [end-begin, cols].
using FillFn = std::function<void(int64_t, int64_t, float*)>;
using ConsumeFn = std::function<void(int64_t, int64_t, const float*)>;

// Collective: the chunked fp32 SUM reduction (reduce_scatter, or all_reduce).
void reduce(Group& group, const ReduceParams& p, const FillFn& fill, const ConsumeFn& consume,
            std::vector<float>& send_buf, std::vector<float>& recv_buf, EpCallStats& stats) {
  const size_t w = size_t(group.size());
  const int me = group.rank();
  // Every rank runs the same number of chunks: R and chunk_rows agree across ranks.
  for (int64_t begin = 0; begin < p.rows; begin += int64_t(p.chunk_rows)) {
    const int64_t end = std::min<int64_t>(p.rows, begin + int64_t(p.chunk_rows));
    const size_t block = size_t(end - begin) * p.cols;  // floats per rank
    if (send_buf.size() < w * block) send_buf.resize(w * block);
    fill(begin, end, send_buf.data());
    if (p.reduce == EpReduce::rs) {
      if (recv_buf.size() < block) recv_buf.resize(block);
      group.reduce_scatter(send_buf.data(), recv_buf.data(), block);
      stats.bytes_recv += block * 4;
      consume(begin, end, recv_buf.data());
    } else {
      group.all_reduce(send_buf.data(), w * block, DType::f32, ReduceOp::sum);
      stats.bytes_recv += w * block * 4;
      consume(begin, end, send_buf.data() + size_t(me) * block);
    }
    stats.bytes_sent += w * block * 4;
    stats.collectives += 1;
  }
}

// exact: a received row contributes K products canon(w·y) of H (zeros for other ranks' slots),
// which the reduction sums over the ranks; the owner then adds its token's slots in slot order.
struct Exact {
  static void fill(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                   float* base) {
    const int k = cfg.num_topk, hd = cfg.hidden;
    for (int j = 0; j < k; ++j) {
      if (h.recv_local_idx[size_t(i * k + j)] >= 0)
        rows::scale_bf16(h.recv_weights[size_t(i * k + j)], y_row(cfg, h, y, i, j),
                         base + size_t(j) * size_t(hd), size_t(hd));
      else
        std::fill_n(base + size_t(j) * size_t(hd), hd, 0.0f);
    }
  }
  static void finish(const EPConfig& cfg, const float* row, const int64_t* token_idx, float* acc,
                     uint16_t* out) {
    const int k = cfg.num_topk, hd = cfg.hidden;
    std::fill_n(acc, hd, 0.0f);
    for (int j = 0; j < k; ++j)
      if (token_idx[j] >= 0) rows::add_f32(row + size_t(j) * size_t(hd), acc, size_t(hd));
    rows::to_bf16(acc, out, size_t(hd));
  }
};

// fast: a received row contributes its partial (local_partial, as f32), which the reduction sums
// over the ranks; the owner rounds the sum.
struct Fast {
  static void fill(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                   float* base) {
    local_partial(cfg, h, y, i, nullptr, base);
  }
  static void finish(const EPConfig& cfg, const float* row, const int64_t*, float*, uint16_t* out) {
    rows::to_bf16(row, out, size_t(cfg.hidden));
  }
};

template <class Mode>
void combine_as(Context& c, CombineScratch& s, const HandleData& h, const uint16_t* y,
                CombineOutput& out) {
  const EPConfig& cfg = c.cfg;
  const int k = cfg.num_topk, hd = cfg.hidden;
  const size_t cols = ag_combine_cols(cfg);
  ReduceParams rp;
  rp.reduce = cfg.reduce;
  rp.rows = h.ag_rows;
  rp.cols = cols;
  rp.chunk_rows = c.sizes.combine_chunk_rows;  // ep_size_hint
  const int64_t* own_idx = h.topk_idx.data<int64_t>();
  uint16_t* ox = out.x.data<uint16_t>();
  float* ow = out.topk_weights.data<float>();
  // Writes every float of the chunk, each once: the received rows in full (the last K columns
  // the weights of this rank's slots, 0 for the others), then zeros for the rows this rank has
  // nothing for.
  auto fill = [&](int64_t begin, int64_t end, float* send) {
    const int64_t span = end - begin;
    s.filled.assign(size_t(c.world) * size_t(span), 0);
    for (int64_t i = 0; i < h.num_recv; ++i) {
      const int64_t t = h.recv_src_token[size_t(i)];
      if (t < begin || t >= end) continue;
      const size_t at = size_t(h.recv_src_rank[size_t(i)]) * size_t(span) + size_t(t - begin);
      s.filled[at] = 1;
      float* base = send + at * cols;
      Mode::fill(cfg, h, y, i, base);
      for (int j = 0; j < k; ++j) {
        const bool local = h.recv_local_idx[size_t(i * k + j)] >= 0;
        base[cols - size_t(k) + size_t(j)] =
            local ? canon(h.recv_weights[size_t(i * k + j)]) : 0.0f;
      }
    }
    for (size_t at = 0; at < s.filled.size(); ++at)
      if (!s.filled[at]) std::fill_n(send + at * cols, cols, 0.0f);
  };
  if (s.acc.size() < size_t(hd)) s.acc.resize(size_t(hd));
  auto consume = [&](int64_t begin, int64_t end, const float* own) {
    for (int64_t t = begin; t < std::min(end, h.num_tokens); ++t) {
      const float* row = own + size_t(t - begin) * cols;
      Mode::finish(cfg, row, own_idx + t * k, s.acc.data(), ox + t * hd);
      for (int j = 0; j < k; ++j)
        ow[t * k + j] = own_idx[t * k + j] < 0 ? 0.0f : row[cols - size_t(k) + size_t(j)];
    }
  };
  reduce(c.group, rp, fill, consume, s.send, s.recv, c.stats);
}

}  // namespace

void combine(Context& c, CombineScratch& s, const HandleData& h, const uint16_t* y,
             CombineOutput& out) {
  if (c.cfg.combine == CombineMode::exact)
    combine_as<Exact>(c, s, h, y, out);
  else
    combine_as<Fast>(c, s, h, y, out);
}

}  // namespace deepinfer::ep::ag
