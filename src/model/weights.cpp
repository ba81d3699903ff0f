#include "model/weights.h"

#include <deepinfer/error.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/check.h"
#include "core/log.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "model/distributed_load.h"

namespace deepinfer::model {

namespace {

int64_t blocks(int64_t n) { return (n + 127) / 128; }

class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& opts, size_t total)
      : ckpt_(ckpt), cfg_(cfg), opts_(opts), total_(total) {}

  const bf16* norm(const std::string& name, int64_t dim) {
    const auto& t = ckpt_.get(name, DType::bf16, {dim});
    account(t.nbytes);
    return t.as<bf16>();
  }

  Linear linear(const std::string& prefix, int64_t out, int64_t in) {
    Linear l;
    l.name = prefix;
    l.out = out;
    l.in = in;
    const std::string wname = prefix + ".weight";
    const TensorView& w = ckpt_.get(wname);
    if (w.shape != std::vector<int64_t>{out, in})
      DI_FAIL("{}", mismatch_message(w, w.dtype, {out, in}));
    if (w.dtype == DType::e4m3) {
      const auto& s =
          ckpt_.get(prefix + ".weight_scale_inv", DType::f32, {blocks(out), blocks(in)});
      l.w_fp8 = w.as<fp8_e4m3>();
      l.w_scale = s.as<float>();
      account(w.nbytes + s.nbytes);
      if (opts_.gemm == GemmMode::bf16) dequantize(l);
    } else if (w.dtype == DType::bf16) {
      l.w_bf16 = w.as<bf16>();
      account(w.nbytes);
      if (opts_.gemm == GemmMode::fp8 && opts_.quantize_fp8) {
        quantize_linear_fp8(l);
        ckpt_.release(wname);  // the BF16 source is not read again
      }
    } else {
      DI_FAIL("tensor {} must be F8_E4M3 (+ weight_scale_inv) or BF16", w.describe());
    }
    if (opts_.decode_layout && l.fp8()) attach_decode_layout(l, l.w_fp8 == w.as<fp8_e4m3>());
    // The cpu kernels read the decode layout only; the checkpoint's codes stay mapped for the
    // host backend and replays, which fault them in again (docs/performance.md §8). The scales,
    // which the kernels read at every step, move out of the mapping too: a read there maps the
    // page cache's folio around it, up to 2 MiB of released codes each (docs/performance.md §6).
    if (l.w_decode && l.w_fp8 == w.as<fp8_e4m3>()) {
      ckpt_.release(wname);
      if (!l.owned_scale.defined()) {
        l.owned_scale = Tensor::empty(DType::f32, {blocks(out), blocks(in)});
        std::memcpy(l.owned_scale.data<float>(), l.w_scale, l.owned_scale.nbytes());
        l.w_scale = l.owned_scale.data<float>();
        ckpt_.release(prefix + ".weight_scale_inv");
      }
    }
    return l;
  }

  // mHC mixing `prefix`.fn [rows, hc·hidden], .scale [rows == hc ? 1 : 3], .base [rows], f32.
  MhcWeights mhc(const std::string& prefix, int64_t rows) {
    const int64_t hc = cfg_.hc_mult;
    const auto& fn = ckpt_.get(prefix + ".fn", DType::f32, {rows, hc * cfg_.hidden_size});
    const auto& sc = ckpt_.get(prefix + ".scale", DType::f32, {rows == hc ? 1 : 3});
    const auto& b = ckpt_.get(prefix + ".base", DType::f32, {rows});
    account(fn.nbytes + sc.nbytes + b.nbytes);
    return {fn.as<float>(), sc.as<float>(), b.as<float>()};
  }

  const TensorView& bf16_tensor(const std::string& name, const std::vector<int64_t>& shape) {
    const auto& t = ckpt_.get(name, DType::bf16, shape);
    account(t.nbytes);
    return t;
  }

  Mlp mlp(const std::string& prefix, int64_t inter) {
    const int64_t h = cfg_.hidden_size;
    return Mlp{linear(prefix + ".gate_proj", inter, h), linear(prefix + ".up_proj", inter, h),
               linear(prefix + ".down_proj", h, inter)};
  }

  // A second copy of the codes in the order the cpu decode GEMM reads (none where the CPU has no
  // such kernel): faster decode GEMMs for +1 byte per fp8 weight, or none resident where the codes
  // stay in the mapped checkpoint and are released (docs/performance.md §5).
  // in_checkpoint: the codes are the checkpoint's own bytes (not a quantized copy), so local
  // ranks of one process that map the same file share one layout of a replicated weight.
  static void attach_decode_layout(Linear& l, bool in_checkpoint = false) {
    const size_t bytes = kernels::decode_layout_bytes(l.out, l.in);
    if (bytes == 0) return;
    std::shared_ptr<std::byte> storage = in_checkpoint
                                             ? shared_decode_layout(l.w_fp8, l.out, l.in, bytes)
                                             : pack_new_decode_layout(l.w_fp8, l.out, l.in, bytes);
    l.owned_decode = Tensor::borrow(std::move(storage), DType::u8, {int64_t(bytes)});
    l.w_decode = l.owned_decode.data<uint8_t>();
  }

  static std::shared_ptr<std::byte> pack_new_decode_layout(const fp8_e4m3* codes, int64_t n,
                                                           int64_t k, size_t bytes) {
    std::shared_ptr<std::byte> storage = detail::weight_alloc(bytes);
    kernels::pack_decode_layout(codes, n, k, reinterpret_cast<uint8_t*>(storage.get()));
    return storage;
  }

  // One decode layout per mapped fp8 tensor in the process: local ranks each load the replicated
  // weights (attention, dense layers, shared experts) from the same mapping, and a layout per
  // rank cost W copies of them, and W streams of the same bytes from memory at every decode
  // step (docs/performance.md §6). Keyed by the codes' address, which no other tensor can have
  // while a layout made from it lives (its weights keep the checkpoint mapped).
  static std::shared_ptr<std::byte> shared_decode_layout(const fp8_e4m3* codes, int64_t n,
                                                         int64_t k, size_t bytes) {
    static std::mutex mu;
    static auto* layouts =
        new std::map<std::tuple<const void*, int64_t, int64_t>, std::weak_ptr<std::byte>>;
    std::lock_guard<std::mutex> lock(mu);  // a rank loading the same tensor waits for its layout
    std::weak_ptr<std::byte>& slot = (*layouts)[{codes, n, k}];
    if (std::shared_ptr<std::byte> live = slot.lock()) return live;
    std::shared_ptr<std::byte> storage = pack_new_decode_layout(codes, n, k, bytes);
    slot = storage;
    if (layouts->size() % 4096 == 0)  // drop the slots of layouts already gone
      std::erase_if(*layouts, [](const auto& e) { return e.second.expired(); });
    return storage;
  }

  static void dequantize(Linear& l) {
    l.owned_w = Tensor::empty(DType::bf16, {l.out, l.in});
    kernels::DequantBlockParams p;
    p.q = l.w_fp8;
    p.scales = l.w_scale;
    p.out = l.owned_w.data<bf16>();
    p.n = l.out;
    p.k = l.in;
    kernels::dequant_per_block(p);
    l.w_bf16 = l.owned_w.data<bf16>();
    l.w_fp8 = nullptr;
    l.w_scale = nullptr;
  }

  // Ends the progress bar at 100% with its newline: the estimate counts tensors (embedding, head,
  // router) that are used in place rather than accounted, so the bar would stop short of it.
  void finish() {
    done_ = std::max(done_, total_);
    account(0);
  }

 private:
  void account(size_t bytes) {
    done_ += bytes;
    if (!opts_.progress || total_ == 0) return;
    const int pct = int(100.0 * double(done_) / double(total_));
    if (pct == last_pct_) return;
    last_pct_ = pct;
    const int filled = pct / 4;
    std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%%", filled, "#########################",
                 25 - filled, "", std::min(pct, 100));
    if (pct >= 100) std::fprintf(stderr, "\n");
  }

  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  const LoadOptions& opts_;
  size_t total_;
  size_t done_ = 0;
  int last_pct_ = -1;

 public:
  size_t loaded() const { return done_; }
};

// The hash tables (checkpoint values where present), the one table's row ranges, and each Engram
// block's dense weights; the table rows themselves are read by the model (its EngramBuffer shard).
void load_engram(const Checkpoint& ck, const ModelConfig& cfg, const LoadOptions& opts, Loader& ld,
                 ModelWeights& mw) {
  const EngramModelConfig& g = cfg.engram;
  EngramWeights& ew = mw.engram;
  const int64_t hc = cfg.hc_mult, h = cfg.hidden_size, E = g.embed_dim(), D = g.head_dim(),
                H = g.heads(), G = g.max_ngram_size, K = g.kernel_size;
  ew.compression = opts.compression ? opts.compression : load_compression_table(ck.dir());
  const CompressionTable& ct = *ew.compression;
  if (g.pad_id >= int64_t(ct.raw_to_canonical.size()))
    DI_FAIL("config.json: engram.pad_id {} is not a token of the tokenizer ({} ids)", g.pad_id,
            ct.raw_to_canonical.size());
  ew.pad_canonical = ct.canonical(g.pad_id, g.pad_id);
  kernels::EngramHashTables& t = ew.hash;
  t = kernels::engram_hash_tables({.layer_ids = g.layer_ids,
                                   .max_ngram_size = G,
                                   .n_head_per_ngram = g.n_head_per_ngram,
                                   .engram_vocab_size = g.engram_vocab_size,
                                   .seed = g.seed,
                                   .vocab_size = ct.num_canonical});
  int64_t base = 0;
  for (int64_t l = 0; l < g.num_layers(); ++l) {
    const int64_t layer = g.layer_ids[size_t(l)];
    const std::string p = fmt::format("model.layers.{}.engram.", layer);
    if (ck.has(p + "multipliers")) {  // the checkpoint's own hash parameters win
      const auto& m = ck.get(p + "multipliers", DType::i64, {G});
      for (int64_t k = 0; k < G; ++k) {
        const int64_t v = m.as<int64_t>()[k];
        if (v <= 0 || v % 2 == 0)
          DI_FAIL("tensor {} holds {} at {}: Engram multipliers must be odd and positive",
                  m.describe(), v, k);
        t.multipliers[size_t(l * G + k)] = v;
      }
    }
    if (ck.has(p + "table_sizes")) {
      const auto& ts = ck.get(p + "table_sizes", DType::i64, {H});
      for (int64_t j = 0; j < H; ++j) {
        const int64_t v = ts.as<int64_t>()[j];
        if (v < 1 || v >= (int64_t(1) << 30))
          DI_FAIL("tensor {} holds {} at {}: Engram table sizes must be in [1, 2^30)",
                  ts.describe(), v, j);
        t.vocab_sizes[size_t(l * H + j)] = int32_t(v);
      }
    }
    int64_t rows = 0;
    for (int64_t j = 0; j < H; ++j) {
      t.offsets[size_t(l * H + j)] = int32_t(base + rows);  // the layer's base row folded in
      rows += t.vocab_sizes[size_t(l * H + j)];
    }
    t.rows[size_t(l)] = rows;
    ew.row_base.push_back(base);
    base += rows;
    if (base >= (int64_t(1) << 31) - 1)
      DI_FAIL(
          "config.json: the Engram tables of all layers hold {}+ rows, beyond int32 row ids; "
          "lower engram.engram_vocab_size or engram.n_head_per_ngram",
          base);

    EngramLayerWeights e;
    e.layer = layer;
    const auto& table = ck.get(p + "embedding.weight");
    if (table.dtype != DType::bf16 || table.shape != std::vector<int64_t>{rows, D})
      DI_FAIL(
          "{}; the table must hold the {} rows of its {} hash heads' prime sizes (from the seed, "
          "the tokenizer's {} compressed ids, or the layer's table_sizes tensor)",
          mismatch_message(table, DType::bf16, {rows, D}), rows, H, ct.num_canonical);
    e.table = table.as<bf16>();
    e.value.name = p + "value_proj";
    e.value.out = h;
    e.value.in = E;
    e.value.w_bf16 = ld.bf16_tensor(p + "value_proj.weight", {h, E}).as<bf16>();
    e.value_bias = ld.bf16_tensor(p + "value_proj.bias", {h}).as<bf16>();
    e.keys = Tensor::empty(DType::bf16, {hc * h, E});
    e.key_bias = Tensor::empty(DType::bf16, {hc * h});
    e.w_fused = Tensor::empty(DType::f32, {hc, h});
    e.conv_norm = Tensor::empty(DType::bf16, {hc, h});
    for (int64_t i = 0; i < hc; ++i) {
      const auto& kw = ld.bf16_tensor(fmt::format("{}key_projs.{}.weight", p, i), {h, E});
      std::memcpy(e.keys.data<bf16>() + i * h * E, kw.data, kw.nbytes);
      const auto& kb = ld.bf16_tensor(fmt::format("{}key_projs.{}.bias", p, i), {h});
      std::memcpy(e.key_bias.data<bf16>() + i * h, kb.data, kb.nbytes);
      const bf16* n1 = ld.bf16_tensor(fmt::format("{}norm1.{}.weight", p, i), {h}).as<bf16>();
      const bf16* n2 = ld.bf16_tensor(fmt::format("{}norm2.{}.weight", p, i), {h}).as<bf16>();
      for (int64_t c = 0; c < h; ++c)  // exact: a product of two bf16 values fits f32
        e.w_fused.data<float>()[i * h + c] = bf16_to_f32(n1[c]) * bf16_to_f32(n2[c]);
      const auto& cn = ld.bf16_tensor(fmt::format("{}short_conv.norms.{}.weight", p, i), {h});
      std::memcpy(e.conv_norm.data<bf16>() + i * h, cn.data, cn.nbytes);
    }
    e.conv_w = ld.bf16_tensor(p + "short_conv.conv.weight", {hc * h, 1, K}).as<bf16>();
    mw.layers[size_t(layer)].engram = l;
    ew.layers.push_back(std::move(e));
  }
  ew.total_rows = base;
}

}  // namespace

std::shared_ptr<const CompressionTable> load_compression_table(const std::string& dir) {
  try {
    return std::make_shared<const CompressionTable>(
        build_compression_table(Tokenizer::from_dir(dir)));
  } catch (const Error& e) {
    DI_FAIL("Engram needs the model's tokenizer for its compression table: {}", e.what());
  }
}

size_t Linear::weight_bytes() const {
  if (fp8()) return size_t(out * in) + size_t(blocks(out) * blocks(in)) * sizeof(float);
  return size_t(out * in) * sizeof(bf16);
}

std::pair<int64_t, int64_t> rank_columns(int64_t n, int64_t q, int64_t W) {
  const int64_t per = (kernels::num_blocks(n) + W - 1) / W;
  return {std::min(n, q * per * 128), std::min(n, (q + 1) * per * 128)};
}

void quantize_linear_fp8(Linear& l) {
  DI_CHECK(l.w_bf16 != nullptr, "quantize_linear_fp8({}) needs a BF16 weight", l.name);
  Tensor w32 = Tensor::empty(DType::f32, {l.out, l.in});
  float* dst = w32.data<float>();
  for (int64_t i = 0; i < l.out * l.in; ++i) dst[i] = bf16_to_f32(l.w_bf16[i]);
  l.owned_w = Tensor::empty(DType::e4m3, {l.out, l.in});
  l.owned_scale = Tensor::empty(DType::f32, {blocks(l.out), blocks(l.in)});
  kernels::QuantBlockParams p;
  p.w = dst;
  p.q = l.owned_w.data<fp8_e4m3>();
  p.scales = l.owned_scale.data<float>();
  p.n = l.out;
  p.k = l.in;
  kernels::quant_per_block(p);
  l.w_fp8 = l.owned_w.data<fp8_e4m3>();
  l.w_scale = l.owned_scale.data<float>();
  l.w_bf16 = nullptr;
}

std::shared_ptr<ModelWeights> load_weights(std::shared_ptr<const Checkpoint> checkpoint,
                                           const ModelConfig& cfg, const LoadOptions& opts) {
  DI_CHECK(opts.ep_size >= 1 && opts.ep_rank >= 0 && opts.ep_rank < opts.ep_size,
           "bad EP rank {} of {}", opts.ep_rank, opts.ep_size);
  if (cfg.n_routed_experts > 0 && cfg.n_routed_experts % opts.ep_size != 0)
    DI_FAIL(
        "the model has {} routed experts, which EP size {} does not divide; choose an EP size that "
        "divides {}",
        cfg.n_routed_experts, opts.ep_size, cfg.n_routed_experts);
  auto mw = std::make_shared<ModelWeights>();
  mw->config = cfg;
  mw->checkpoint = checkpoint;
  const Checkpoint& ck = *checkpoint;
  const int64_t h = cfg.hidden_size, heads = cfg.num_attention_heads;
  mw->num_local_experts = cfg.n_routed_experts / opts.ep_size;
  mw->first_local_expert = opts.ep_rank * mw->num_local_experts;

  // Estimate this rank's bytes for the progress bar: replicated tensors + its share of experts.
  size_t total = 0;
  for (const auto& n : ck.names()) {
    const int64_t e = routed_expert_of(n);
    if (is_engram_table(n)) continue;  // read by the model, its rows only
    if (e < 0 ||
        (e >= mw->first_local_expert && e < mw->first_local_expert + mw->num_local_experts))
      total += ck.get(n).nbytes;
  }
  Loader ld(ck, cfg, opts, total);

  const auto& embed = ck.get("model.embed_tokens.weight", DType::bf16, {cfg.vocab_size, h});
  mw->embed = embed.as<bf16>();
  mw->final_norm = ld.norm("model.norm.weight", h);
  DI_CHECK(!opts.fp8_head || opts.gemm == GemmMode::fp8,
           "an FP8 LM head (--head fp8) needs FP8 GEMMs; drop --head fp8 or --gemm bf16");
  // An LM head [vocab, hidden]: BF16 as checkpoints ship it, or quantized (LoadOptions::fp8_head).
  auto head = [&](const std::string& name) {
    Linear l;
    l.name = name;
    l.out = cfg.vocab_size;
    l.in = h;
    l.w_bf16 = ck.get(name + ".weight", DType::bf16, {cfg.vocab_size, h}).as<bf16>();
    if (opts.fp8_head) {
      quantize_linear_fp8(l);
      if (opts.decode_layout) Loader::attach_decode_layout(l);  // a per-rank quantized copy
    } else if (name != "model.embed_tokens" && opts.ep_size == 1) {
      // Streamed whole every step: copied to huge-page weight storage, its file pages dropped
      // (docs/performance.md §6). A tied head stays in the mapping the embedding reads.
      const size_t bytes = size_t(l.out * l.in) * sizeof(bf16);
      l.owned_w = Tensor::borrow(detail::weight_alloc(bytes), DType::bf16, {l.out, l.in});
      std::memcpy(l.owned_w.data<bf16>(), l.w_bf16, bytes);
      l.w_bf16 = l.owned_w.data<bf16>();
      ck.release(name + ".weight");
    } else if (name != "model.embed_tokens") {
      // With several ranks each computes its vocabulary slice (rank_columns) every step: that
      // slice is copied to weight storage (all ranks together: one head) and its file pages are
      // dropped; w_bf16 stays in the mapping for anything else (docs/performance.md §6).
      l.slice = rank_columns(l.out, opts.ep_rank, opts.ep_size);
      const int64_t cols = l.slice.second - l.slice.first;
      const size_t bytes = size_t(cols * l.in) * sizeof(bf16);
      const bf16* src = l.w_bf16 + l.slice.first * l.in;
      l.owned_w = Tensor::borrow(detail::weight_alloc(bytes), DType::bf16, {cols, l.in});
      std::memcpy(l.owned_w.data<bf16>(), src, bytes);
      l.w_slice = l.owned_w.data<bf16>();
      ck.release(src, bytes);
    }
    return l;
  };
  mw->lm_head =
      head(ck.has("lm_head.weight") || !cfg.tie_word_embeddings ? "lm_head" : "model.embed_tokens");
  // MTP: module 0's block loads as one more layer (rank-sharded experts like the others).
  if (opts.mtp && (cfg.hc_mult > 1 || cfg.engram.enabled()))
    DI_FAIL(
        "--speculative mtp: this model has {}, which deepinfer's MTP module does not carry yet; "
        "drop --speculative",
        cfg.hc_mult > 1 ? "mHC branches (hc_mult > 1)" : "Engram blocks");
  const std::string mtp0 = fmt::format("model.layers.{}", cfg.num_hidden_layers);
  if (opts.mtp && (cfg.num_nextn_predict_layers < 1 || !ck.has(mtp0 + ".eh_proj.weight")))
    DI_FAIL(
        "--speculative mtp needs a checkpoint with an MTP module (num_nextn_predict_layers >= 1 "
        "and the tensors {}.*), but this one has {}; drop --speculative or use a checkpoint with "
        "one",
        mtp0,
        cfg.num_nextn_predict_layers < 1 ? std::string("num_nextn_predict_layers = 0")
                                         : "no " + mtp0 + ".eh_proj.weight");
  if (!opts.mtp && cfg.num_nextn_predict_layers > 0)
    log_info("skipping {} MTP layer(s) (layer {}+): speculative decoding is not used",
             cfg.num_nextn_predict_layers, cfg.num_hidden_layers);
  const int64_t num_layers = cfg.num_hidden_layers + (opts.mtp ? 1 : 0);

  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}", i);
    LayerWeights L;
    L.input_norm = ld.norm(p + ".input_layernorm.weight", h);
    L.post_attn_norm = ld.norm(p + ".post_attention_layernorm.weight", h);
    const std::string a = p + ".self_attn";
    const int64_t qk = cfg.qk_head_dim();
    if (cfg.q_lora_rank > 0) {
      L.q_a = ld.linear(a + ".q_a_proj", cfg.q_lora_rank, h);
      L.q_a_norm = ld.norm(a + ".q_a_layernorm.weight", cfg.q_lora_rank);
      L.q_b = ld.linear(a + ".q_b_proj", heads * qk, cfg.q_lora_rank);
    } else {
      L.q = ld.linear(a + ".q_proj", heads * qk, h);
    }
    L.kv_a = ld.linear(a + ".kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, h);
    L.kv_a_norm = ld.norm(a + ".kv_a_layernorm.weight", cfg.kv_lora_rank);
    L.kv_b = ld.linear(a + ".kv_b_proj", heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                       cfg.kv_lora_rank);
    L.o = ld.linear(a + ".o_proj", h, heads * cfg.v_head_dim);
    L.moe = cfg.is_moe_layer(i);
    const std::string m = p + ".mlp";
    if (!L.moe) {
      L.dense = ld.mlp(m, cfg.intermediate_size);
    } else {
      const auto& g = ck.get(m + ".gate.weight", DType::bf16, {cfg.n_routed_experts, h});
      L.router.name = m + ".gate";
      L.router.out = cfg.n_routed_experts;
      L.router.in = h;
      L.router.w_bf16 = g.as<bf16>();
      if (cfg.topk_method == TopkMethod::noaux_tc)
        L.router_bias =
            ck.get(m + ".gate.e_score_correction_bias", DType::f32, {cfg.n_routed_experts})
                .as<float>();
      for (int64_t e = 0; e < mw->num_local_experts; ++e)
        L.experts.push_back(ld.mlp(fmt::format("{}.experts.{}", m, mw->first_local_expert + e),
                                   cfg.moe_intermediate_size));
      if (cfg.n_shared_experts > 0) {
        L.shared = ld.mlp(m + ".shared_experts", cfg.n_shared_experts * cfg.moe_intermediate_size);
        L.has_shared = true;
      }
    }
    if (cfg.hc_mult > 1) {
      const int64_t mixes = cfg.hc_mult * (cfg.hc_mult + 2);
      L.attn_hc = ld.mhc(p + ".attn_hc", mixes);
      L.ffn_hc = ld.mhc(p + ".ffn_hc", mixes);
    }
    mw->layers.push_back(std::move(L));
  }
  if (cfg.hc_mult > 1) mw->hc_head = ld.mhc("model.hc_head", cfg.hc_mult);
  if (cfg.engram.enabled()) load_engram(ck, cfg, opts, ld, *mw);
  if (opts.mtp) {
    MtpWeights m;
    m.enorm = ld.norm(mtp0 + ".enorm.weight", h);
    m.hnorm = ld.norm(mtp0 + ".hnorm.weight", h);
    m.eh_proj = ld.linear(mtp0 + ".eh_proj", h, 2 * h);
    m.head_norm = ld.norm(mtp0 + ".shared_head.norm.weight", h);
    m.head =
        ck.has(mtp0 + ".shared_head.head.weight") ? head(mtp0 + ".shared_head.head") : mw->lm_head;
    mw->mtp.push_back(std::move(m));
  }
  mw->loaded_bytes = ld.loaded();
  ld.finish();
  return mw;
}

}  // namespace deepinfer::model
