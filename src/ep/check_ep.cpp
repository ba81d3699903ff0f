#include "ep/check_ep.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <map>
#include <string>

#include "core/check.h"
#include "core/log.h"
#include "ep/reference.h"

namespace deepinfer::ep {
namespace {

struct CaseSpec {
  EpAlgo algo = EpAlgo::ag;
  DispatchDType dtype = DispatchDType::bf16;
  bool expand = false;
  int align = 1;
  CombineMode combine = CombineMode::exact;
  AgRows rows = AgRows::max;
  EpReduce reduce = EpReduce::rs;
  bool small_chunk = false;
  bool peer_memory = true;  // a2a: the direct lowering (on), else the exchange (off)
  // x and y written where dispatch and combine read them (EPBuffer::dispatch_input and
  // combine_input), else into tensors of their own.
  bool in_place = false;

  std::string name() const {
    std::string s = fmt::format("algo={} dtype={} expand={} align={} combine={}", to_string(algo),
                                dtype == DispatchDType::fp8 ? "fp8" : "bf16", expand ? 1 : 0, align,
                                to_string(combine));
    if (algo != EpAlgo::a2a)
      s += fmt::format(" rows={} reduce={} chunk={}", to_string(rows), to_string(reduce),
                       small_chunk ? "4K" : "default");
    if (!peer_memory) s += " peer_memory=off";
    if (in_place) s += " x,y=in_place";
    return s;
  }
  // Cases that must give the same combine output (same data, same combine semantics).
  std::string compare_key() const {
    return fmt::format("{}/{}/{}/{}", int(dtype), expand, align, int(combine));
  }
};

// The shape of the check at world W (small data, several experts per rank at small W).
struct Shape {
  int hidden, max_tokens, local_experts, topk;
};
Shape shape_for(int w) {
  Shape s;
  s.hidden = w <= 8 ? 200 : 136;  // not multiples of 128: partial fp8 scale blocks
  s.max_tokens = w <= 8 ? 40 : (w <= 16 ? 24 : 12);
  s.local_experts = w <= 2 ? 8 : (w <= 8 ? 4 : (w <= 16 ? 2 : 1));
  s.topk = std::min(6, w * s.local_experts);
  return s;
}

int bf16_ulp_diff(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t v) { return (v & 0x8000) ? -int(v & 0x7fff) : int(v); };
  return std::abs(ord(a) - ord(b));
}

// Collects the first mismatches of one case on this rank.
struct Checker {
  std::string case_name;
  int rank = 0;
  int failures = 0;
  void fail(const std::string& what) {
    if (++failures <= 3) log_error("check ep FAIL [{}]: {}", case_name, what);
  }
  template <class T>
  void equal_bytes(const char* what, const T* got, size_t n_got, const T* want, size_t n_want) {
    if (n_got != n_want)
      return fail(fmt::format("{}: {} elements, expected {}", what, n_got, n_want));
    if (n_got == 0 || std::memcmp(got, want, n_got * sizeof(T)) == 0) return;
    for (size_t i = 0; i < n_got; ++i)
      if (std::memcmp(got + i, want + i, sizeof(T)) != 0)
        return fail(fmt::format("{}: first mismatch at element {} of {}", what, i, n_got));
  }
  void equal_tensor(const char* what, const Tensor& got, const void* want, size_t want_bytes) {
    const size_t n = got.defined() ? got.nbytes() : 0;
    equal_bytes(what, static_cast<const uint8_t*>(got.defined() ? got.raw() : nullptr), n,
                static_cast<const uint8_t*>(want), want_bytes);
  }
  void equal_tensors(const char* what, const Tensor& a, const Tensor& b) {
    if (a.defined() != b.defined() || (a.defined() && a.shape() != b.shape()))
      return fail(fmt::format("{}: shapes {} vs {}", what, a.defined() ? a.describe() : "-",
                              b.defined() ? b.describe() : "-"));
    if (a.defined()) equal_tensor(what, a, b.raw(), b.nbytes());
  }
};

void check_dispatch(Checker& c, const DispatchOutput& out, const ref::ExpectedDispatch& ex,
                    const EPConfig& cfg) {
  c.equal_bytes("num_recv_tokens_per_rank", out.num_recv_tokens_per_rank.data(),
                out.num_recv_tokens_per_rank.size(), ex.per_rank.data(), ex.per_rank.size());
  c.equal_bytes("num_recv_tokens_per_expert (raw)", out.num_recv_tokens_per_expert.data(),
                out.num_recv_tokens_per_expert.size(), ex.count_raw.data(), ex.count_raw.size());
  c.equal_bytes("num_recv_tokens_per_expert (aligned)",
                out.num_recv_tokens_per_expert_aligned.data(),
                out.num_recv_tokens_per_expert_aligned.size(), ex.count_aligned.data(),
                ex.count_aligned.size());
  if (out.num_recv_tokens != ex.num_recv)
    c.fail(fmt::format("num_recv_tokens {} expected {}", out.num_recv_tokens, ex.num_recv));
  c.equal_tensor("recv x", out.x, ex.x.data(), ex.x.size());
  if (cfg.dispatch_dtype == DispatchDType::fp8)
    c.equal_tensor("recv scales", out.scales, ex.scales.data(), ex.scales.size() * 4);
  c.equal_tensor("recv topk_idx", out.topk_idx, ex.topk_idx.data(), ex.topk_idx.size() * 8);
  c.equal_tensor("recv topk_weights", out.topk_weights, ex.weights.data(), ex.weights.size() * 4);
  c.equal_tensor("recv src (gid)", out.src, ex.src.data(), ex.src.size() * 8);
}

void check_same_dispatch(Checker& c, const DispatchOutput& a, const DispatchOutput& b) {
  c.equal_tensors("cached x", a.x, b.x);
  c.equal_tensors("cached scales", a.scales, b.scales);
  c.equal_tensors("cached topk_idx", a.topk_idx, b.topk_idx);
  c.equal_tensors("cached topk_weights", a.topk_weights, b.topk_weights);
  c.equal_tensors("cached src", a.src, b.src);
  c.equal_tensors("cached expand_row", a.expand_row, b.expand_row);
  if (a.num_recv_tokens_per_expert_aligned != b.num_recv_tokens_per_expert_aligned)
    c.fail("cached aligned expert counts differ");
}

// Expert outputs for the received rows: a closed form of (global token, expert or rank), and
// garbage on expand padding rows (combine must ignore them).
// y: where to write them ([N or S, H] bf16), or undefined for a new tensor.
Tensor make_y(const DispatchOutput& out, const EPConfig& cfg, int rank, int world, uint64_t seed,
              const std::vector<int64_t>& token_offset, Tensor y = {}) {
  const int64_t rows = out.src.dim(0), h = cfg.hidden, m = cfg.num_max_tokens_per_rank;
  const int64_t l = cfg.num_experts / world;
  if (!y.defined()) y = Tensor::empty(DType::bf16, {rows, h});
  uint16_t* py = y.data<uint16_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t gid = out.src.data<int64_t>()[i];
    if (gid < 0) {
      std::fill_n(py + i * h, h, uint16_t(0x4248));  // 50.0: padding garbage
      continue;
    }
    const int64_t gtok = token_offset[size_t(gid / m)] + gid % m;
    const int64_t key =
        cfg.expand ? int64_t(rank) * l + out.topk_idx.data<int64_t>()[i] : cfg.num_experts + rank;
    for (int64_t c = 0; c < h; ++c) py[i * h + c] = ref::y_value(seed, gtok, key, int(c));
  }
  return y;
}

void check_layout(Checker& c, const EPBuffer& buf, const ref::RankInput& in, const EPConfig& cfg,
                  int world) {
  const Layout lay = buf.layout(Tensor::borrow(const_cast<int64_t*>(in.topk_idx.data()), DType::i64,
                                               {in.num_tokens, cfg.num_topk}));
  const int64_t k = cfg.num_topk, l = cfg.num_experts / world;
  std::vector<int64_t> per_rank(size_t(world), 0), per_expert(size_t(cfg.num_experts), 0);
  std::vector<uint8_t> in_rank(size_t(in.num_tokens) * size_t(world), 0);
  for (int64_t t = 0; t < in.num_tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = in.topk_idx[size_t(t * k + j)];
      if (e < 0) continue;
      per_expert[size_t(e)]++;
      in_rank[size_t(t * world + e / l)] = 1;
    }
  for (int64_t t = 0; t < in.num_tokens; ++t)
    for (int r = 0; r < world; ++r) per_rank[size_t(r)] += in_rank[size_t(t * world + r)];
  c.equal_bytes("layout num_tokens_per_rank", lay.num_tokens_per_rank.data(),
                lay.num_tokens_per_rank.size(), per_rank.data(), per_rank.size());
  c.equal_bytes("layout num_tokens_per_expert", lay.num_tokens_per_expert.data(),
                lay.num_tokens_per_expert.size(), per_expert.data(), per_expert.size());
  c.equal_bytes("layout is_token_in_rank", lay.is_token_in_rank.data(), lay.is_token_in_rank.size(),
                in_rank.data(), in_rank.size());
}

// Invalid input on one rank must be an Error on every rank (agreed before data moves), never a
// hang or a timeout. Returns the number of failed expectations on this rank.
// Over a shared window (mpi): x written through dispatch_input is still there after dispatch (the
// model's shared experts read it), also where the window barely holds x: dispatch_input must then
// not offer the window, whose growth for the rest of what dispatch exposes would free it under x.
// Run before anything else has grown the group's window past the 1 MiB it starts with. Returns
// the bytes of x that changed (0 = pass), summed over ranks.
int64_t check_x_survives_dispatch(Group& group) {
  const int w = group.size(), me = group.rank();
  std::array<std::byte, 64> tiny{};
  std::vector<const std::byte*> peers;
  group.expose(std::array{std::span<const std::byte>(tiny)}, peers);  // the window exists: 1 MiB
  group.barrier();
  EPConfig cfg;
  cfg.num_experts = 2 * w;
  cfg.hidden = 7168;
  cfg.num_topk = 2;
  cfg.num_max_tokens_per_rank = int64_t(1 << 20) / cfg.hidden;  // x alone fits in 1 MiB
  cfg.dispatch_dtype = DispatchDType::fp8;
  cfg.algo = EpAlgo::a2a;
  cfg.peer_memory = EpPeerMemory::on;
  EPBuffer buf(group, cfg);
  const int64_t t = cfg.num_max_tokens_per_rank, p = cfg.scale_cols();
  std::vector<uint8_t> x(size_t(t * cfg.hidden));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = uint8_t((i * 131 + size_t(me) * 17) % 251);  // no NaN codes
  std::vector<float> scales(size_t(t * p), 1.0f), weights(size_t(t * 2), 0.5f);
  std::vector<int64_t> idx(size_t(t * 2));
  for (int64_t i = 0; i < t; ++i)
    idx[size_t(2 * i)] = i % cfg.num_experts, idx[size_t(2 * i + 1)] = (i + 1) % cfg.num_experts;
  DispatchInput in;
  in.x = buf.dispatch_input(t);
  std::memcpy(in.x.raw(), x.data(), x.size());
  in.scales = Tensor::borrow(scales.data(), DType::f32, {t, p});
  in.topk_weights = Tensor::borrow(weights.data(), DType::f32, {t, 2});
  in.topk_idx = Tensor::borrow(idx.data(), DType::i64, {t, 2});
  buf.dispatch(in);
  int64_t changed = 0;
  const auto* now = static_cast<const uint8_t*>(in.x.raw());
  for (size_t i = 0; i < x.size(); ++i) changed += now[i] != x[i];
  group.all_reduce(&changed, 1, DType::i64, ReduceOp::sum);
  return changed;
}

int check_invalid_inputs(Group& group, const EPConfig& base, const ref::GenParams& gp, bool print) {
  const int w = group.size(), me = group.rank();
  int failed = 0;
  struct Bad {
    const char* name;
    int bad_rank;
    int kind;  // 0 repeated expert, 1 out of range, 2 T > M, 3 wrong weights dtype
  };
  const Bad cases[] = {{"repeated expert in a row", w - 1, 0},
                       {"expert id out of range", 0, 1},
                       {"T > num_max_tokens_per_rank", w / 2, 2},
                       {"topk_weights wrong dtype", w - 1, 3}};
  for (const Bad& b : cases) {
    EPConfig cfg = base;
    EPBuffer buf(group, cfg);
    ref::RankInput in = ref::make_input(gp, me);
    std::vector<int64_t> big_idx;
    std::vector<uint8_t> big_x;
    std::vector<float> big_w;
    DispatchInput di = in.as_input(cfg);
    if (me == b.bad_rank) {
      const int64_t k = cfg.num_topk;
      if (b.kind == 0 || b.kind == 1) {
        // Give the rank one token if it has none, then corrupt it.
        if (in.num_tokens == 0) {
          in = ref::make_input(gp, 0);
          di = in.as_input(cfg);
        }
        in.topk_idx[0] = 0;
        if (b.kind == 0)
          in.topk_idx[size_t(k - 1)] = 0;
        else
          in.topk_idx[size_t(k - 1)] = cfg.num_experts;
      } else if (b.kind == 2) {
        const int64_t t = cfg.num_max_tokens_per_rank + 1;
        big_idx.assign(size_t(t * k), -1);
        big_x.assign(size_t(t * cfg.hidden * 2), 0);
        big_w.assign(size_t(t * k), 0.0f);
        di.x = Tensor::borrow(big_x.data(), DType::bf16, {t, cfg.hidden});
        di.topk_idx = Tensor::borrow(big_idx.data(), DType::i64, {t, k});
        di.topk_weights = Tensor::borrow(big_w.data(), DType::f32, {t, k});
      } else {
        di.topk_weights = Tensor::borrow(in.weights.data(), DType::bf16, {in.num_tokens, k});
      }
    }
    std::string what;
    try {
      buf.dispatch(di);
      what = "dispatch returned normally";
    } catch (const CommTimeout& e) {
      what = std::string("timed out instead of an error: ") + e.what();
    } catch (const Error& e) {
      // The bad rank names its problem; every other rank names the bad rank (an unrelated error,
      // e.g. a collective mismatch after a rank left alone, does not count).
      const std::string want = me == b.bad_rank
                                   ? fmt::format("ep dispatch on rank {}/{}", me, w)
                                   : fmt::format("rank {} passed invalid input", b.bad_rank);
      what = std::string(e.what()).find(want) == std::string::npos
                 ? fmt::format("error does not say '{}': {}", want, e.what())
                 : std::string();
      if (print && me == 0) log_debug("check ep: invalid input '{}' -> {}", b.name, e.what());
    }
    if (!what.empty()) {
      ++failed;
      log_error("check ep FAIL [invalid input: {} on rank {}]: {}", b.name, b.bad_rank, what);
    }
  }
  // Config mismatch across ranks: detected at construction on every rank.
  if (w > 1) {
    EPConfig cfg = base;
    if (me == 0) cfg.num_max_tokens_per_rank += 1;
    try {
      EPBuffer buf(group, cfg);
      ++failed;
      log_error("check ep FAIL [M differs across ranks]: construction succeeded");
    } catch (const CommTimeout& e) {
      ++failed;
      log_error("check ep FAIL [M differs across ranks]: timed out: {}", e.what());
    } catch (const Error&) {
    }
  }
  return failed;
}

}  // namespace

CheckEpResult run_check_ep(Group& group, const CheckEpOptions& opts) {
  const int w = group.size(), me = group.rank();
  const bool ordered = group.capabilities().ordered_reduce;
  const Shape shape = shape_for(w);
  const bool prune = !opts.full && w > 4;
  const int keep_every = w >= 32 ? 8 : 4;

  EPConfig base = opts.policy;
  base.num_experts = w * shape.local_experts;
  base.hidden = opts.hidden > 0 ? opts.hidden : shape.hidden;
  base.num_topk = shape.topk;
  base.num_max_tokens_per_rank = opts.tokens > 0 ? opts.tokens : shape.max_tokens;

  // Inputs of every rank, regenerated locally from (seed, rank), per dispatch dtype.
  std::map<int, std::vector<ref::RankInput>> inputs;
  std::vector<int64_t> token_offset(size_t(w) + 1, 0);
  for (DispatchDType dt : {DispatchDType::bf16, DispatchDType::fp8}) {
    ref::GenParams gp{opts.seed, w, base};
    gp.cfg.dispatch_dtype = dt;
    auto& v = inputs[int(dt)];
    for (int r = 0; r < w; ++r) v.push_back(ref::make_input(gp, r));
    for (int r = 0; r < w; ++r)
      token_offset[size_t(r) + 1] = token_offset[size_t(r)] + v[size_t(r)].num_tokens;
  }

  std::vector<CaseSpec> cases;
  for (EpAlgo algo : opts.algos) {
    int base_index = 0;
    for (DispatchDType dt : {DispatchDType::bf16, DispatchDType::fp8})
      for (int ea = 0; ea < 4; ++ea)
        for (CombineMode cm : opts.combines) {
          CaseSpec cs;
          cs.algo = algo;
          cs.dtype = dt;
          cs.expand = ea >= 2;
          cs.align = ea % 2 ? 128 : 1;
          cs.combine = cm;
          // a2a on a group with peer memory: the direct combine and the exchange one.
          const int variants =
              algo == EpAlgo::ag ? 8 : (group.peer_memory() != PeerMemory::none ? 2 : 1);
          for (int v = 0; v < variants; ++v) {
            if (algo == EpAlgo::ag && prune && (v + base_index) % keep_every != 0) continue;
            cs.rows = v & 1 ? AgRows::cap : AgRows::max;
            cs.reduce = v & 2 ? EpReduce::ar : EpReduce::rs;
            cs.small_chunk = v & 4;
            cs.peer_memory = algo == EpAlgo::ag || v == 0;
            cs.in_place = base_index % 2 == 1;
            cases.push_back(cs);
          }
          ++base_index;
        }
  }

  // Extra checks after the cases: invalid input, then (over a shared window) x kept through
  // dispatch.
  const bool window = group.peer_memory() == PeerMemory::window;
  std::vector<int64_t> case_failed(cases.size() + 1 + window, 0);
  if (window && check_x_survives_dispatch(group) != 0) case_failed[cases.size() + 1] = 1;
  std::map<std::string, std::vector<uint16_t>> combined_by_key;
  int64_t ulp_diffs = 0, ulp_max = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const CaseSpec& cs = cases[ci];
    EPConfig cfg = base;
    cfg.algo = cs.algo;
    cfg.dispatch_dtype = cs.dtype;
    cfg.expand = cs.expand;
    cfg.expert_alignment = cs.align;
    cfg.combine = cs.combine;
    cfg.ag_rows = cs.rows;
    cfg.reduce = cs.reduce;
    cfg.chunk_bytes = cs.small_chunk ? 4096 : (64u << 20);
    cfg.peer_memory = cs.peer_memory ? EpPeerMemory::on : EpPeerMemory::off;
    Checker c{cs.name(), me};
    std::vector<ref::RankInput>& all = inputs[int(cs.dtype)];
    ref::RankInput& in = all[size_t(me)];

    EPBuffer buf(group, cfg);
    if (opts.verbose && me == 0)
      fmt::print("check ep: case {}/{} {} (resolved {})\n", ci + 1, cases.size(), cs.name(),
                 to_string(buf.algorithm()));
    check_layout(c, buf, in, cfg, w);
    // dispatch_input, combine_input: on mpi's direct lowering views of the shared window, which
    // expose then does not copy (x read in place needs every rank's x there: all cases agree).
    DispatchInput din = in.as_input(cfg);
    Tensor x_in;
    if (cs.in_place) {
      x_in = buf.dispatch_input(din.x.dim(0));
      if (x_in.nbytes()) std::memcpy(x_in.raw(), din.x.raw(), x_in.nbytes());
      din.x = x_in;
    }
    const DispatchOutput out = buf.dispatch(din);
    check_dispatch(c, out, ref::expected_dispatch(all, cfg, w, me), cfg);
    if (cs.in_place)  // the model reads x again after dispatch (its shared experts)
      c.equal_tensor("x after dispatch", x_in, in.as_input(cfg).x.raw(), size_t(x_in.nbytes()));
    const DispatchOutput cached =
        buf.dispatch(in.as_input(cfg).x, in.as_input(cfg).scales, out.handle);
    check_same_dispatch(c, cached, out);
    din.x = {};  // combine_input reuses x's place (EPBuffer throws while x is alive)
    x_in = {};

    const Tensor y = make_y(out, cfg, me, w, opts.seed, token_offset,
                            cs.in_place ? buf.combine_input(out.handle) : Tensor());
    const CombineOutput comb = buf.combine(y, out.handle);
    const ref::ExpectedCombine ec = ref::expected_combine(all, cfg, w, me, opts.seed, token_offset);
    c.equal_tensor("combined weights", comb.topk_weights, ec.weights.data(), ec.weights.size() * 4);
    const uint16_t* got = comb.x.data<uint16_t>();
    const size_t n = size_t(comb.x.numel());
    const bool unordered_fast =
        cs.combine == CombineMode::fast && !ordered && buf.algorithm() == EpAlgo::ag;
    if (n != ec.x.size()) {
      c.fail(fmt::format("combine output has {} elements, expected {}", n, ec.x.size()));
    } else if (!unordered_fast) {
      c.equal_bytes("combine x", got, n, ec.x.data(), ec.x.size());
    } else {
      for (size_t i = 0; i < n; ++i) {
        const int d = bf16_ulp_diff(got[i], ec.x[i]);
        if (d == 0) continue;
        ++ulp_diffs;
        ulp_max = std::max<int64_t>(ulp_max, d);
        if (d > 1) c.fail(fmt::format("fast combine x[{}] differs by {} bf16 ulp (> 1)", i, d));
      }
    }
    // exact: identical to the single-rank result of the same global batch.
    if (cs.combine == CombineMode::exact && cs.expand && n == ec.x.size()) {
      const std::vector<ref::RankInput> one{in};
      EPConfig one_cfg = cfg;
      const ref::ExpectedCombine e1 =
          ref::expected_combine(one, one_cfg, 1, 0, opts.seed, {token_offset[size_t(me)]});
      c.equal_bytes("exact combine vs W=1", got, n, e1.x.data(), e1.x.size());
    }
    // Same data and semantics under another algorithm / chunking / reduce: same bits.
    auto [it, first] =
        combined_by_key.try_emplace(cs.compare_key(), std::vector<uint16_t>(got, got + n));
    if (!first) {
      const bool tolerant = cs.combine == CombineMode::fast && !ordered;
      if (it->second.size() != n) {
        c.fail("combine size differs across algorithms");
      } else if (!tolerant) {
        if (n && std::memcmp(it->second.data(), got, n * 2) != 0)
          c.fail("combine differs from the first algorithm/variant with the same data");
      } else {
        for (size_t i = 0; i < n; ++i)
          if (bf16_ulp_diff(it->second[i], got[i]) > 1) {
            c.fail(fmt::format("combine x[{}] differs by > 1 ulp across algorithms", i));
            break;
          }
      }
    }
    case_failed[ci] = c.failures ? 1 : 0;
  }
  // Invalid input under each algorithm: ag agrees through its all_reduce, a2a through its plan.
  int invalid_failed = 0;
  for (EpAlgo algo : opts.algos) {
    EPConfig cfg = base;
    cfg.algo = algo;
    invalid_failed +=
        check_invalid_inputs(group, cfg, ref::GenParams{opts.seed, w, cfg}, opts.verbose);
  }
  case_failed[cases.size()] = invalid_failed ? 1 : 0;

  group.all_reduce(case_failed.data(), case_failed.size(), DType::i64, ReduceOp::max);
  std::array<int64_t, 2> diffs{ulp_diffs, ulp_max};
  group.all_reduce(diffs.data(), 1, DType::i64, ReduceOp::sum);
  group.all_reduce(diffs.data() + 1, 1, DType::i64, ReduceOp::max);

  CheckEpResult res;
  std::map<std::string, std::pair<int, int>> per_algo;
  for (size_t ci = 0; ci < case_failed.size(); ++ci) {
    const std::string key = ci < cases.size()    ? std::string(to_string(cases[ci].algo))
                            : ci == cases.size() ? "invalid-input"
                                                 : "x-in-place";
    auto& pa = per_algo[key];
    if (case_failed[ci]) {
      ++res.failed;
      ++pa.second;
      if (me == 0)
        fmt::print("check ep: FAIL {}\n", ci < cases.size() ? cases[ci].name() : key + " checks");
    } else {
      ++res.passed;
      ++pa.first;
    }
  }
  res.fast_ulp_diffs = diffs[0];
  if (me == 0) {
    fmt::print("check ep: {} on {} W={} E={} H={} K={} M={} ({} cases{})\n",
               ordered ? "ordered reduce" : "unordered reduce", group.backend(), w,
               base.num_experts, base.hidden, base.num_topk, base.num_max_tokens_per_rank,
               case_failed.size(), prune ? ", ag variants pruned" : "");
    for (const auto& [k, v] : per_algo)
      fmt::print("check ep: {:14s} {} passed, {} failed\n", k, v.first, v.second);
    if (!ordered)
      fmt::print(
          "check ep: fast combine through the backend's reduce_scatter: {} elements differ from "
          "ascending "
          "rank order (max {} bf16 ulp)\n",
          diffs[0], diffs[1]);
  }
  return res;
}

}  // namespace deepinfer::ep
