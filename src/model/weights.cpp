#include "model/weights.h"

#include <deepinfer/error.h>
#include <unistd.h>

#include <cstdio>

#include "core/check.h"
#include "core/log.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"

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
      if (opts_.gemm == GemmMode::fp8 && opts_.quantize_fp8) quantize_linear_fp8(l);
    } else {
      DI_FAIL("tensor {} must be F8_E4M3 (+ weight_scale_inv) or BF16", w.describe());
    }
    if (opts_.decode_layout && l.fp8()) attach_decode_layout(l);
    return l;
  }

  Mlp mlp(const std::string& prefix, int64_t inter) {
    const int64_t h = cfg_.hidden_size;
    return Mlp{linear(prefix + ".gate_proj", inter, h), linear(prefix + ".up_proj", inter, h),
               linear(prefix + ".down_proj", h, inter)};
  }

  // A second copy of the codes in the order the cpu decode GEMM reads (none where the CPU has no
  // such kernel): faster decode GEMMs for +1 byte per fp8 weight (docs/performance.md §5).
  static void attach_decode_layout(Linear& l) {
    const size_t bytes = kernels::decode_layout_bytes(l.out, l.in);
    if (bytes == 0) return;
    l.owned_decode = Tensor::empty(DType::u8, {int64_t(bytes)});
    kernels::pack_decode_layout(l.w_fp8, l.out, l.in, l.owned_decode.data<uint8_t>());
    l.w_decode = l.owned_decode.data<uint8_t>();
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

}  // namespace

size_t Linear::weight_bytes() const {
  if (fp8()) return size_t(out * in) + size_t(blocks(out) * blocks(in)) * sizeof(float);
  return size_t(out * in) * sizeof(bf16);
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
    const auto pos = n.find(".mlp.experts.");
    if (pos == std::string::npos) {
      total += ck.get(n).nbytes;
    } else {
      const int64_t e = std::atoll(n.c_str() + pos + 13);
      if (e >= mw->first_local_expert && e < mw->first_local_expert + mw->num_local_experts)
        total += ck.get(n).nbytes;
    }
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
      if (opts.decode_layout) Loader::attach_decode_layout(l);
    }
    return l;
  };
  mw->lm_head =
      head(ck.has("lm_head.weight") || !cfg.tie_word_embeddings ? "lm_head" : "model.embed_tokens");
  // MTP: module 0's block loads as one more layer (rank-sharded experts like the others).
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
    mw->layers.push_back(std::move(L));
  }
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
