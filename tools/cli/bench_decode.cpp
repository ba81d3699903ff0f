// `deepinfer bench decode`: end-to-end prefill and decode speed of the engine (JSON lines, the
// benchmark contract of docs/performance.md §1): prefill of a 128-token prompt in tokens/s against
// the fp32 FMA peak, and decode tokens/s against the decode roofline = read bandwidth (memcpy,
// measured in this run) ÷ active weight bytes per token. --model synthetic writes a
// DeepSeek-V3-architecture model with random BF16 weights (fixed seed) in HF layout into
// --synthetic-dir and loads it with
// --quantize fp8. --speculative mtp [--draft-tokens k] adds a line for self-speculative decode
// (docs/architecture.md §6.1): tokens/s against plain decode's of the same run (runs alternate),
// i.e. the speedup, with the acceptance (accepted / verified drafts), tokens per verify step and
// the share of the time in the MTP forwards; the tokens must equal plain greedy decode's. With
// --model synthetic the model then has an MTP module (its own folder, --synthetic-dir + "-mtp").
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/testing/bench.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
#include "synthetic_model.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

namespace fs = std::filesystem;

struct BenchDecodeCli {
  std::string model = "models/tiny";
  int ep = 1;
  int threads = 2;
  std::string quantize;
  std::string synthetic_dir = "build/synthetic-v3";
  int64_t prompt_tokens = 128;
  int64_t decode_tokens = 32;
  int reps = 3;
  std::string prompt;  // decode prompt text ("" = 16 seeded random ids)
  SpeculativeOptions speculative;
};

// Multiply-adds per token of the linear layers a token runs (top-k experts), ×2 = flops.
double linear_flops_per_token(const model::ModelConfig& c) {
  const double h = double(c.hidden_size), H = double(c.num_attention_heads);
  double f = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    f += c.q_lora_rank > 0 ? double(c.q_lora_rank) * (h + H * double(c.qk_head_dim()))
                           : h * H * double(c.qk_head_dim());
    f += h * double(c.kv_lora_rank + c.qk_rope_head_dim);
    f += H * double(c.kv_lora_rank) *
         double(c.qk_nope_head_dim + c.v_head_dim);  // absorbed W_UK, W_UV
    f += H * double(c.v_head_dim) * h;
    if (c.is_moe_layer(l))
      f += h * double(c.n_routed_experts) + 3.0 * h * double(c.moe_intermediate_size) *
                                                double(c.num_experts_per_tok + c.n_shared_experts);
    else
      f += 3.0 * h * double(c.intermediate_size);
  }
  f += h * double(c.vocab_size);
  return 2.0 * f;
}

int run_bench_decode(BenchDecodeCli o) {
  Knobs kn = knobs();
  kn.threads = o.threads;
  set_knobs(kn);
  std::string dir = o.model;
  std::string name = fs::path(o.model).filename().string();
  if (o.model == "synthetic") {
    dir = o.synthetic_dir;
    name = "synthetic-v3";
    if (o.speculative.on()) {  // the same model plus an MTP module, in its own folder
      dir += "-mtp";
      name += "-mtp";
    }
    write_synthetic_model(dir, o.speculative.on());
    if (o.quantize.empty()) o.quantize = "fp8";
  }
  ThreadPool pool(o.threads);
  kernels::testing::BenchContext ctx;
  ctx.threads = o.threads;
  ctx.pool = &pool;
  const double bw_gbps = ctx.memcpy_gbps(size_t(256) << 20);
  const double peak_gflops = ctx.fma_peak_gflops();

  runtime::LaunchModelOptions lo;
  lo.model_dir = dir;
  lo.ep = o.ep;
  lo.quantize_fp8 = o.quantize == "fp8";
  lo.mtp = o.speculative.on();
  runtime::run_model_ranks(lo, [&](runtime::RankContext& rc) {
    runtime::EngineOptions eo;
    eo.model = model::ModelOptions::from_knobs();
    eo.max_tokens_per_step = std::max<int64_t>(256, o.prompt_tokens);
    runtime::Engine engine(rc.weights, rc.group, eo);
    const auto& cfg = rc.weights->config;
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
    for (auto& t : prompt) t = int32_t(rng() % uint32_t(cfg.vocab_size));
    // Prefill: one 128-token prompt per rank, one generated token.
    std::vector<double> pre, dec;
    for (int r = 0; r < o.reps + 1; ++r) {
      runtime::Request q;
      q.prompt = prompt;
      q.max_new_tokens = 1;
      const auto s0 = engine.stats();
      engine.generate({q});
      const auto s1 = engine.stats();
      if (r > 0) pre.push_back(s1.prefill_seconds - s0.prefill_seconds);  // first run warms up
    }
    // Decode: a short prompt (--prompt's tokens, else 16 of the random ids), then decode_tokens
    // greedy tokens (batch 1 per rank); seconds per generated token, the run's tokens, and its
    // drafted/accepted counts.
    std::vector<int32_t> decode_prompt(prompt.begin(),
                                       prompt.begin() + std::min<int64_t>(16, o.prompt_tokens));
    if (!o.prompt.empty()) decode_prompt = Tokenizer::from_dir(dir).encode(o.prompt);
    std::vector<int32_t> plain_tokens, spec_tokens;
    runtime::EngineStats spec_sum;
    // One run of engine e; after the warm-up (r = 0) its seconds per token and counts are kept.
    auto decode = [&](runtime::Engine& e, int r, std::vector<double>& per_token,
                      std::vector<int32_t>& tokens, runtime::EngineStats* sum) {
      runtime::Request q;
      q.prompt = decode_prompt;
      q.max_new_tokens = o.decode_tokens + 1;
      const auto s0 = e.stats();
      tokens = e.generate({q})[0].tokens;
      const auto s1 = e.stats();
      if (r == 0) return;
      per_token.push_back((s1.decode_seconds - s0.decode_seconds) /
                          double(s1.decode_emitted - s0.decode_emitted));
      if (sum) {
        sum->decode_emitted += s1.decode_emitted - s0.decode_emitted;
        sum->drafted += s1.drafted - s0.drafted;
        sum->accepted += s1.accepted - s0.accepted;
        sum->decode_seconds += s1.decode_seconds - s0.decode_seconds;
        sum->draft_seconds += s1.draft_seconds - s0.draft_seconds;
      }
    };
    // With --speculative the plain and speculative runs alternate, so both see the same moments
    // of a shared machine.
    std::unique_ptr<runtime::Engine> spec_engine;
    if (o.speculative.on()) {
      runtime::EngineOptions so = eo;
      so.draft_tokens = o.speculative.draft_tokens;
      spec_engine = std::make_unique<runtime::Engine>(rc.weights, rc.group, so);
    }
    std::vector<double> spec;
    for (int r = 0; r < o.reps + 1; ++r) {
      decode(engine, r, dec, plain_tokens, nullptr);
      if (spec_engine) decode(*spec_engine, r, spec, spec_tokens, &spec_sum);
    }
    if (rc.group.rank() != 0) return;
    std::sort(pre.begin(), pre.end());
    std::sort(dec.begin(), dec.end());
    const double pre_s = pre[pre.size() / 2], dec_s = dec[dec.size() / 2];
    const std::string tag = fmt::format("{} ep={} threads={}{}", name, o.ep, o.threads,
                                        lo.quantize_fp8 ? " quantize=fp8" : "");
    // Prefill: flops of the linears (top-k experts) + attention over the causal prompt.
    const double T = double(o.prompt_tokens);
    const double attn_flops =
        2.0 * double(cfg.num_hidden_layers) * double(cfg.num_attention_heads) *
        double(2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim) * T * (T + 1) / 2.0;
    const double pre_flops = linear_flops_per_token(cfg) * T + attn_flops;
    kernels::testing::BenchRecord a;
    a.bench = "decode";
    a.case_name = fmt::format("{} prefill {} tokens", tag, o.prompt_tokens);
    a.seconds = pre_s;
    a.flops = pre_flops;
    a.limit = "fma_peak_gflops";
    a.limit_value = peak_gflops;
    a.ratio = pre_flops / pre_s / 1e9 / peak_gflops;
    a.extra = {{"tokens_per_s", T / pre_s}};
    ctx.emit(a);
    const double bytes = engine.model().active_weight_bytes_per_token();
    kernels::testing::BenchRecord d;
    d.bench = "decode";
    d.case_name = fmt::format("{} decode batch 1", tag);
    d.seconds = dec_s;
    d.bytes = bytes;
    d.limit = "memcpy_gbps";
    d.limit_value = bw_gbps;
    d.ratio = bytes / dec_s / 1e9 / bw_gbps;
    d.extra = {{"tokens_per_s", 1.0 / dec_s}, {"roofline_tokens_per_s", bw_gbps * 1e9 / bytes}};
    ctx.emit(d);
    if (o.speculative.on()) {
      // Speculative decode against plain decode of the same run (the limit it must beat).
      std::sort(spec.begin(), spec.end());
      const double spec_s = spec[spec.size() / 2];
      const int64_t k = o.speculative.draft_tokens;
      kernels::testing::BenchRecord x;
      x.bench = "decode";
      x.case_name = fmt::format("{} decode batch 1 speculative mtp k={}", tag, k);
      x.seconds = spec_s;
      x.limit = "plain_decode_tokens_per_s";
      x.limit_value = 1.0 / dec_s;
      x.ratio = dec_s / spec_s;                                                  // the speedup
      const double steps = double(spec_sum.decode_emitted - spec_sum.accepted);  // verify steps
      x.extra = {
          {"tokens_per_s", 1.0 / spec_s},
          {"speedup", dec_s / spec_s},
          {"acceptance", double(spec_sum.accepted) / std::max(1.0, double(spec_sum.drafted))},
          {"accepted_per_step", double(spec_sum.accepted) / std::max(1.0, steps)},
          {"tokens_per_step", double(spec_sum.decode_emitted) / std::max(1.0, steps)},
          {"draft_share", spec_sum.draft_seconds / std::max(1e-30, spec_sum.decode_seconds)},
          {"step_over_plain_token", spec_sum.decode_seconds / std::max(1.0, steps) / dec_s},
          {"greedy_identical", spec_tokens == plain_tokens ? 1.0 : 0.0}};
      DI_CHECK(spec_tokens == plain_tokens,
               "speculative decode generated other tokens than plain greedy decode");
      ctx.emit(x);
    }
  });
  return 0;
}

DEEPINFER_COMMAND(
    "bench", "decode",
    "Engine prefill (vs the fp32 FMA peak) and decode (vs the weight-read roofline) tokens/s; "
    "JSON lines. --model synthetic: a DeepSeek-V3-architecture model with random BF16 weights",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchDecodeCli>();
      app.add_option("--model", o->model, "Model folder, or `synthetic` (default models/tiny)");
      app.add_option("--ep", o->ep, "Expert-parallel ranks (threads; default 1)")
          ->check(CLI::Range(1, 64));
      app.add_option("--threads", o->threads, "Kernel threads (default 2)")
          ->check(CLI::Range(1, 1024));
      app.add_option("--quantize", o->quantize,
                     "fp8: quantize BF16 weights at load (synthetic: always)")
          ->check(CLI::IsMember({"fp8"}));
      app.add_option(
          "--synthetic-dir", o->synthetic_dir,
          "Where the synthetic model is written (reused if present; default build/synthetic-v3)");
      app.add_option("--prompt-tokens", o->prompt_tokens, "Prefill prompt length (default 128)")
          ->check(CLI::Range(int64_t(1), int64_t(4096)));
      app.add_option("--decode-tokens", o->decode_tokens, "Decode steps per run (default 32)")
          ->check(CLI::Range(int64_t(1), int64_t(4096)));
      app.add_option("--reps", o->reps, "Timed runs; the median is reported (default 3)")
          ->check(CLI::Range(1, 100));
      app.add_option("--prompt", o->prompt,
                     "Decode prompt text, tokenized with the model's tokenizer (default: 16 random "
                     "token ids)");
      o->speculative.add_to(app);
      return [o] { return run_bench_decode(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
