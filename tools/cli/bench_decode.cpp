// `deepinfer bench decode`: end-to-end prefill and decode speed of the engine (JSON lines, the
// benchmark contract of docs/performance.md §1): prefill of a 128-token prompt in tokens/s against
// the fp32 FMA peak (and the BF16-dot peak where the CPU has it), and decode at batch B against
// the decode roofline = read bandwidth (a 1 GiB read-only pass in this run) ÷ the weight bytes a
// step reads (shared weights once, the distinct experts the batch routes to); at EP 1 also against
// the compute time of the step's GEMM flops at the BF16-dot (else FMA) peak, and `roofline_ratio`
// against the larger of the two (a large batch is compute-bound on a CPU). --profile prints the
// decode step per op and per layer, each GEMM op against the rooflines of its calls
// (docs/performance.md §8). --model synthetic writes a
// DeepSeek-V3-architecture model with random weights (fixed seed; FP8 linears) in HF layout into
// --synthetic-dir and loads it. --speculative mtp [--draft-tokens k] adds a line for
// self-speculative decode (docs/architecture.md §6.1): tokens/s against plain decode's of the same
// run (runs alternate), i.e. the speedup, with the acceptance (accepted / verified drafts), tokens
// per verify step and the share of the time in the MTP forwards; the tokens must equal plain greedy
// decode's. With
// --model synthetic the model then has an MTP module (its own folder, --synthetic-dir + "-mtp").
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/profiler.h"
#include "kernels/testing/bench.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
#include "step_turns.h"
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
  std::string synthetic_dir = "build/synthetic-v3-fp8";
  int64_t prompt_tokens = 128;
  int64_t decode_tokens = 32;
  int reps = 3;
  std::vector<int64_t> batch = {1};  // sequences decoding together
  bool profile = false;
  std::string prompt;  // decode prompt text ("" = 16 seeded random ids)
  SpeculativeOptions speculative;
  HeadOption head;
  bool vs_ep1 = false;  // an EP 1 world of the same sequences, taking turns with this one
  std::string ab;       // --ab BINARY: the peer that takes turns step by step
  std::vector<std::string> ab_env;  // --ab-env NAME=VALUE: the peer's environment on top of ours
  std::string ab_peer;              // --ab-peer R,W (hidden): this process is the peer
};

// The model folder and the name the JSON cases use; --model synthetic writes it first (once).
std::pair<std::string, std::string> model_dir_and_name(const BenchDecodeCli& o) {
  if (o.model != "synthetic") return {o.model, fs::path(o.model).filename().string()};
  std::string dir = o.synthetic_dir, name = "synthetic-v3";
  if (o.speculative.on()) {  // the same model plus an MTP module, in its own folder
    dir += "-mtp";
    name += "-mtp";
  }
  write_synthetic_model(dir, o.speculative.on());
  return {dir, name};
}

// What every JSON case of the run starts with.
std::string case_tag(const BenchDecodeCli& o, const std::string& name) {
  return fmt::format("{} ep={} threads={}{}{}", name, o.ep, o.threads,
                     o.quantize == "fp8" ? " quantize=fp8" : "", o.head.fp8() ? " head=fp8" : "");
}

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

constexpr int64_t kDecodePrompt = 16;  // prompt tokens of each decode-batch sequence

// B requests of `prompt_len` random tokens (distinct per request), each generating `new_tokens`.
std::vector<runtime::Request> decode_requests(int64_t B, int64_t prompt_len, int64_t new_tokens,
                                              int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<runtime::Request> rs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& q = rs[size_t(b)];
    q.id = b;
    q.prompt.resize(static_cast<size_t>(prompt_len));
    for (auto& t : q.prompt) t = int32_t(rng() % uint64_t(vocab));
    q.max_new_tokens = new_tokens;
  }
  return rs;
}

// The decode batch of rank `rank` of `ranks`, B sequences each: its slice of the ranks·B requests
// EP 1 runs at batch ranks·B (ids renumbered from 0), so EP N and EP 1 decode the same sequences.
std::vector<runtime::Request> rank_decode_requests(int64_t B, int ranks, int rank,
                                                   int64_t new_tokens, int32_t vocab) {
  const int64_t all = B * ranks;
  auto rs = decode_requests(all, kDecodePrompt, new_tokens, vocab, 100 + uint64_t(all));
  rs.erase(rs.begin(), rs.begin() + rank * B);
  rs.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) rs[size_t(b)].id = b;
  return rs;
}

// An engine for `batch` sequences whose longest prompt is `prompt_len` tokens, each generating
// decode_tokens + 1: prefill chunks of at least 256 tokens, and KV pages for all of them at once.
runtime::EngineOptions decode_engine_options(int64_t batch, int64_t prompt_len,
                                             int64_t decode_tokens, int32_t vocab) {
  runtime::EngineOptions eo;
  eo.model = model::ModelOptions::from_knobs();
  eo.max_tokens_per_step = std::max<int64_t>({256, prompt_len, batch * kDecodePrompt});
  eo.max_batch = std::max<int64_t>(eo.max_batch, batch);
  eo.kv_pages =
      batch * runtime::pages_needed(decode_requests(1, std::max(prompt_len, kDecodePrompt),
                                                    decode_tokens + 1, vocab, 0)[0]);
  return eo;
}

// Each result's generated tokens, padded with -1 to `width` (a stop token may end one early).
std::vector<int32_t> padded_tokens(const std::vector<runtime::RequestResult>& results,
                                   int64_t width) {
  std::vector<int32_t> out;
  for (const auto& r : results) {
    DI_CHECK(int64_t(r.tokens.size()) <= width, "request {} generated {} tokens, more than {}",
             r.id, r.tokens.size(), width);
    out.insert(out.end(), r.tokens.begin(), r.tokens.end());
    out.resize(out.size() + size_t(width) - r.tokens.size(), -1);
  }
  return out;
}

// --vs-ep1: the EP N world and an EP 1 world (every expert on one rank, the same threads) in this
// process take turns, so each timed EP N run has an EP 1 run of the same sequences next to it in
// time: on a shared VM whose read bandwidth moves by a factor of two within minutes, separate
// commands compare different minutes. Turn k of world w is slot 2k + w, and every rank of a world
// takes every turn of it, so the two worlds never run at once.
class Turns {
 public:
  explicit Turns(std::array<int, 2> ranks) : ranks_(ranks) {}
  // Runs f as this rank's next turn (its k-th, counted by the caller) in world w.
  template <class F>
  void take(int w, int64_t& k, const F& f) {
    {
      std::unique_lock lock(mu_);
      // A turn is one run of a batch (or a profile): ten minutes without one is a hang.
      if (!cv_.wait_for(lock, std::chrono::minutes(10),
                        [&] { return failed_ || slot_ == 2 * k + w; })) {
        if (!failed_) first_failed_ = w;
        failed_ = true;
        cv_.notify_all();
        throw Error(fmt::format(
            "bench decode --vs-ep1: world {} waited 10 minutes for its turn {}; the other world "
            "made no progress",
            w, k));
      }
      if (failed_) throw Error("bench decode --vs-ep1: the other world failed; see its error");
    }
    ++k;
    try {
      f();
    } catch (...) {
      fail(w);
      throw;
    }
    std::lock_guard lock(mu_);
    if (++done_ == ranks_[size_t(w)]) {
      done_ = 0;
      ++slot_;
      cv_.notify_all();
    }
  }
  // World w failed: the other's next turn throws. The first world to fail holds the cause.
  void fail(int w) {
    std::lock_guard lock(mu_);
    if (!failed_) first_failed_ = w;
    failed_ = true;
    cv_.notify_all();
  }
  int first_failed() {
    std::lock_guard lock(mu_);
    return first_failed_;
  }

 private:
  std::array<int, 2> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t slot_ = 0;
  int done_ = 0;
  bool failed_ = false;
  int first_failed_ = -1;
};

// Mean over decode steps of the (MoE layer, expert) pairs the batch routes to: the experts a step
// must read. `results` come from a recorded run; decode step j feeds position prompt_len + j.
double distinct_experts_per_step(const std::vector<runtime::RequestResult>& results,
                                 int64_t prompt_len, int64_t steps) {
  if (results.empty() || results[0].routing.empty()) return 0;
  const size_t layers = results[0].routing.size();
  const int64_t K = int64_t(results[0].routing[0].size()) / results[0].num_positions;
  double total = 0;
  for (int64_t j = 0; j < steps; ++j)
    for (size_t l = 0; l < layers; ++l) {
      std::vector<int64_t> ids;
      for (const auto& r : results)
        for (int64_t k = 0; k < K; ++k)
          ids.push_back(r.routing[l][size_t((prompt_len + j) * K + k)]);
      std::sort(ids.begin(), ids.end());
      total += double(std::unique(ids.begin(), ids.end()) - ids.begin());
    }
  return total / double(steps);
}

// --ab BINARY: this process and a peer (BINARY with --ab-env on top of this environment) load the
// same model and decode the same sequences at each batch, taking turns one engine step at a time in
// ABBA order (step_turns.h). Per batch one line: each side's median decode-step time and their
// ratio, the peer's over this one's (> 1: this binary is faster), and whether the greedy tokens are
// the same. The peer runs this function too (--ab-peer), prints nothing and sends its figures back.
// At --ep N each side runs N local ranks (B sequences each): rank 0 holds the turn, and every rank
// starts and ends the step together (barriers), its pool asleep before the turn passes.
int run_bench_decode_ab(const BenchDecodeCli& o) {
  if (o.vs_ep1 || o.speculative.on() || o.profile)
    DI_USAGE(
        "--ab takes turns with another binary at decode only: drop --vs-ep1, --speculative and "
        "--profile");
  for (const std::string& e : o.ab_env)
    if (e.find('=') == std::string::npos || e.find('=') == 0)
      DI_USAGE("--ab-env {}: expected NAME=VALUE, e.g. DEEPINFER_BATCH_INVARIANT=off", e);
  Knobs kn = knobs();
  kn.threads = o.threads;
  set_knobs(kn);
  std::string dir, name;
  std::tie(dir, name) = model_dir_and_name(o);  // before the peer starts: it reuses the folder
  std::optional<StepTurns> turns;
  if (o.ab_peer.empty()) {
    std::string batches;
    for (int64_t b : o.batch) batches += fmt::format("{}{}", batches.empty() ? "" : ",", b);
    const std::vector<std::pair<std::string, std::string>> options = {
        {"--model", o.model},
        {"--synthetic-dir", o.synthetic_dir},
        {"--threads", std::to_string(o.threads)},
        {"--ep", std::to_string(o.ep)},
        {"--batch", batches},
        {"--decode-tokens", std::to_string(o.decode_tokens)},
        {"--reps", std::to_string(o.reps)},
        {"--head", o.head.precision}};
    std::vector<std::string> argv = {o.ab, "bench", "decode"};
    for (const auto& [option, value] : options) argv.insert(argv.end(), {option, value});
    if (!o.quantize.empty()) argv.insert(argv.end(), {"--quantize", o.quantize});
    turns.emplace(StepTurns::spawn(argv, o.ab_env));
  } else {
    turns.emplace(StepTurns::attach(o.ab_peer));
  }
  kernels::testing::BenchContext ctx;
  ctx.threads = o.threads;
  struct PerBatch {
    std::vector<double> step_s;   // each timed decode step's seconds, in order
    std::vector<int32_t> tokens;  // the last run's, request by request
  };
  std::vector<PerBatch> mine(o.batch.size());
  std::vector<std::vector<std::vector<int32_t>>> rank_tokens(
      o.batch.size(), std::vector<std::vector<int32_t>>(size_t(o.ep)));  // [batch][rank]
  double flops_per_token = 0;
  runtime::LaunchModelOptions lo;
  lo.model_dir = dir;
  lo.ep = o.ep;
  lo.quantize_fp8 = o.quantize == "fp8";
  lo.fp8_head = o.head.fp8();
  runtime::run_model_ranks(lo, [&](runtime::RankContext& rc) {
    const int32_t V = int32_t(rc.weights->config.vocab_size);
    const int rank = rc.group.rank();
    const bool lead = rank == 0;
    if (lead) flops_per_token = linear_flops_per_token(rc.weights->config);
    const int64_t max_batch = *std::max_element(o.batch.begin(), o.batch.end());
    runtime::Engine engine(rc.weights, rc.group,
                           decode_engine_options(max_batch, kDecodePrompt, o.decode_tokens, V));
    for (size_t bi = 0; bi < o.batch.size(); ++bi) {
      const int64_t B = o.batch[bi];
      const auto reqs = rank_decode_requests(B, o.ep, rank, o.decode_tokens + 1, V);
      for (int r = 0; r < o.reps + 1; ++r) {  // run 0 warms up
        std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(B));
        for (const auto& q : reqs) engine.start(q);
        while (engine.num_active() > 0) {
          // A decode step: every sequence has its first token (its prefill is done).
          bool decoding = true;
          for (const auto& t : tokens) decoding &= !t.empty();
          if (lead) turns->acquire();
          if (o.ep > 1) rc.group.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          const auto events = engine.step();
          if (o.ep > 1) rc.group.barrier();
          const auto t1 = std::chrono::steady_clock::now();
          // The pool's workers poll for a while after a call before they sleep: polling during
          // the peer's step would slow it (two processes, one set of CPUs).
          kernels::kernel_pool().wait_until_asleep();
          if (o.ep > 1) rc.group.barrier();
          if (lead) turns->release([] {});
          for (const auto& e : events)
            if (e.token >= 0) tokens[size_t(e.id)].push_back(e.token);
          if (lead && r > 0 && decoding)
            mine[bi].step_s.push_back(std::chrono::duration<double>(t1 - t0).count());
        }
        if (r == o.reps) {
          std::vector<int32_t>& mine_r = rank_tokens[bi][size_t(rank)];
          mine_r.clear();
          for (const auto& t : tokens) mine_r.insert(mine_r.end(), t.begin(), t.end());
        }
      }
    }
  });
  for (size_t bi = 0; bi < o.batch.size(); ++bi)
    for (const auto& t : rank_tokens[bi])
      mine[bi].tokens.insert(mine[bi].tokens.end(), t.begin(), t.end());
  turns->finish();
  if (!turns->is_a()) {
    for (const PerBatch& p : mine) {
      turns->send(p.step_s);
      turns->send(p.tokens);
    }
    return 0;
  }
  std::vector<PerBatch> peer(o.batch.size());
  for (PerBatch& p : peer) {
    p.step_s = turns->receive<double>();
    p.tokens = turns->receive<int32_t>();
  }
  turns->wait_peer();
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::string peer_env;
  for (const std::string& e : o.ab_env) peer_env += " " + e;
  for (size_t bi = 0; bi < o.batch.size(); ++bi) {
    const int64_t B = o.batch[bi];
    const PerBatch &a = mine[bi], &b = peer[bi];
    // Step k of each side ran next to the other's (same sequences, same step count).
    std::vector<double> pairs;
    for (size_t k = 0; k < std::min(a.step_s.size(), b.step_s.size()); ++k)
      pairs.push_back(b.step_s[k] / a.step_s[k]);
    const double a_s = median(a.step_s), b_s = median(b.step_s);
    kernels::testing::BenchRecord d;
    d.bench = "decode";
    d.case_name =
        fmt::format("{} decode batch {} ab vs {}{}", case_tag(o, name), B, o.ab, peer_env);
    d.seconds = a_s;
    d.flops = double(B * o.ep) * flops_per_token;
    d.limit = "peer_step_seconds";
    d.limit_value = b_s;
    d.ratio = b_s / a_s;
    d.extra = {{"steps", double(a.step_s.size())},
               {"peer_steps", double(b.step_s.size())},
               {"step_ms", 1e3 * a_s},
               {"peer_step_ms", 1e3 * b_s},
               {"ratio_pairs_median", median(pairs)},
               {"tokens_per_s", double(B * o.ep) / a_s},
               {"peer_tokens_per_s", double(B * o.ep) / b_s},
               {"identical_tokens", a.tokens == b.tokens ? 1.0 : 0.0}};
    ctx.emit(d);
  }
  return 0;
}

int run_bench_decode(BenchDecodeCli o) {
  if (o.vs_ep1 && o.ep < 2)
    DI_USAGE("--vs-ep1 compares EP N with EP 1: give --ep N with N >= 2 (got --ep {})", o.ep);
  if (o.vs_ep1 && o.speculative.on())
    DI_USAGE("--vs-ep1 and --speculative do not go together: run them as two commands");
  if (!o.ab.empty() || !o.ab_peer.empty()) return run_bench_decode_ab(o);
  Knobs kn = knobs();
  kn.threads = o.threads;
  set_knobs(kn);
  std::string dir, name;
  std::tie(dir, name) = model_dir_and_name(o);
  ThreadPool pool(o.threads);
  kernels::testing::BenchContext ctx;
  ctx.threads = o.threads;
  ctx.pool = &pool;
  // A decode step reads its weights and writes almost nothing: its limit is a read-only pass.
  const double bw_start_gbps = ctx.read_gbps(kernels::testing::kReadPassBytes);
  // The peaks too are measured again after the prefill runs (the larger counts), as the read pass
  // is after each decode case: rank 0 updates them before it uses them.
  double peak_gflops = ctx.fma_peak_gflops();
  double bf16_dot_gflops = ctx.bf16_dot_peak_gflops();
  // DEEPINFER_AMX=on: the fp8 GEMMs run TDPBF16PS (the bf16 ones, the LM head among them, still
  // VDPBF16PS), whose peak is then their limit.
  double amx_gflops = kernels::cpu::amx_active() ? ctx.amx_peak_gflops() : 0.0;
  const int64_t max_batch = *std::max_element(o.batch.begin(), o.batch.end());

  runtime::LaunchModelOptions lo;
  lo.model_dir = dir;
  lo.ep = o.ep;
  lo.quantize_fp8 = o.quantize == "fp8";
  std::mutex print_mutex;
  lo.mtp = o.speculative.on();
  lo.fp8_head = o.head.fp8();
  // --vs-ep1: EP 1's tokens/s of each timed run of each batch, filled by its world in its turns.
  std::unique_ptr<Turns> turns;
  std::vector<std::vector<double>> ep1_tok_s(o.batch.size());
  std::vector<std::vector<int32_t>> ep1_tokens(o.batch.size());  // its last run's, padded
  std::thread ep1_thread;
  std::exception_ptr ep1_error;
  if (o.vs_ep1) {
    turns = std::make_unique<Turns>(std::array<int, 2>{o.ep, 1});
    runtime::LaunchModelOptions lo1 = lo;
    lo1.ep = 1;
    // World 1 takes a turn for each of world 0's: one when both are loaded (world 0's is empty),
    // an empty one for world 0's prefill, then per batch the timed runs, then an empty one for
    // world 0's untimed work (recorded run, read pass, record).
    ep1_thread = std::thread([&, lo1] {
      try {
        runtime::run_model_ranks(lo1, [&](runtime::RankContext& rc) {
          const int32_t V = int32_t(rc.weights->config.vocab_size);
          // Only the decode batches: no prompt_tokens prefill in this world.
          runtime::Engine engine(
              rc.weights, rc.group,
              decode_engine_options(max_batch * o.ep, kDecodePrompt, o.decode_tokens, V));
          int64_t k = 0;
          turns->take(1, k, [] {});  // loaded: world 0 may start timing
          turns->take(1, k, [] {});
          for (size_t i = 0; i < o.batch.size(); ++i) {
            const auto reqs = rank_decode_requests(o.batch[i] * o.ep, 1, 0, o.decode_tokens + 1, V);
            for (int r = 0; r < o.reps + 1; ++r)
              turns->take(1, k, [&] {
                const auto s0 = engine.stats();
                const auto results = engine.generate(reqs);
                const auto s1 = engine.stats();
                if (r > 0)
                  ep1_tok_s[i].push_back(double(s1.decode_emitted - s0.decode_emitted) /
                                         (s1.decode_seconds - s0.decode_seconds));
                if (r == o.reps) ep1_tokens[i] = padded_tokens(results, o.decode_tokens + 1);
              });
            turns->take(1, k, [] {});
          }
        });
      } catch (...) {
        ep1_error = std::current_exception();
        turns->fail(1);
      }
    });
  }
  try {
    runtime::run_model_ranks(lo, [&](runtime::RankContext& rc) {
      const auto& cfg = rc.weights->config;
      const int32_t V = int32_t(cfg.vocab_size);
      const runtime::EngineOptions eo =
          decode_engine_options(max_batch, o.prompt_tokens, o.decode_tokens, V);
      runtime::Engine engine(rc.weights, rc.group, eo);
      const bool lead = rc.group.rank() == 0;
      // This rank's turns (--vs-ep1); without it f just runs.
      int64_t turn = 0;
      auto in_turn = [&](const auto& f) {
        if (turns)
          turns->take(0, turn, f);
        else
          f();
      };
      const std::string tag = case_tag(o, name);
      in_turn([] {});  // --vs-ep1: the next turn waits for EP 1's world to load
      in_turn([&] {
        // Prefill: one prompt_tokens prompt per rank, one generated token; the first run warms up.
        std::vector<double> pre;
        const runtime::Request pre_req = decode_requests(1, o.prompt_tokens, 1, V, 7)[0];
        for (int r = 0; r < o.reps + 1; ++r) {
          const auto s0 = engine.stats();
          engine.generate({pre_req});
          const auto s1 = engine.stats();
          if (r > 0) pre.push_back(s1.prefill_seconds - s0.prefill_seconds);
        }
        if (lead) {
          ctx.forget_peaks();
          peak_gflops = std::max(peak_gflops, ctx.fma_peak_gflops());
          bf16_dot_gflops = std::max(bf16_dot_gflops, ctx.bf16_dot_peak_gflops());
          if (amx_gflops > 0) amx_gflops = std::max(amx_gflops, ctx.amx_peak_gflops());
          std::sort(pre.begin(), pre.end());
          const double pre_s = pre[pre.size() / 2];
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
          if (bf16_dot_gflops > 0) {
            a.extra["bf16_dot_peak_gflops"] = bf16_dot_gflops;
            a.extra["ratio_bf16_dot_peak"] = pre_flops / pre_s / 1e9 / bf16_dot_gflops;
          }
          if (amx_gflops > 0) {
            a.extra["amx_peak_gflops"] = amx_gflops;
            a.extra["ratio_amx_peak"] = pre_flops / pre_s / 1e9 / amx_gflops;
          }
          ctx.emit(a);
        }
      });

      const model::DecodeWeightBytes wb = engine.model().decode_weight_bytes();
      // Bytes read from the checkpoint per rank at load (DEEPINFER_LOAD): the largest over ranks.
      int64_t read_max = int64_t(rc.load.read_bytes());
      rc.group.all_reduce(&read_max, 1, DType::i64, ReduceOp::max);
      // --profile: the same decode under the profiler. Step until every prefill is done, then
      // profile the decode steps (every rank steps the same number of times: equal lengths).
      auto profile_decode = [&](runtime::Engine& e, const std::vector<runtime::Request>& reqs,
                                const std::string& what) {
        for (const auto& q : reqs) e.start(q);
        std::vector<int64_t> emitted(reqs.size(), 0);
        auto count = [&](const std::vector<runtime::StepEvent>& ev) {
          for (const auto& x : ev) ++emitted[size_t(x.id)];
        };
        while (*std::min_element(emitted.begin(), emitted.end()) == 0) count(e.step());
        kernels::Profiler prof;
        {
          // Each GEMM call's floor: a read pass of this minute (the larger with the first; the
          // other ranks wait in the all_reduce) and the peaks, at this rank's share of the threads.
          double lim[3] = {0, 0, 0};
          if (lead) {
            const double dot = bf16_dot_gflops > 0 ? bf16_dot_gflops : peak_gflops;
            lim[0] = std::max(bw_start_gbps, ctx.read_gbps_fresh(kernels::testing::kReadPassBytes));
            lim[1] = dot;
            lim[2] = amx_gflops > 0 ? amx_gflops : dot;
          }
          rc.group.all_reduce(lim, 3, DType::f64, ReduceOp::max);
          const double share = double(kernels::kernel_pool().num_threads()) / double(o.threads);
          prof.set_limits({lim[0] * share, lim[1] * share, lim[2] * share});
        }
        int64_t steps = 0;
        double seconds = 0;
        {
          kernels::ScopedProfiler use(&prof);
          while (e.num_active() > 0) {
            const auto t0 = std::chrono::steady_clock::now();
            count(e.step());
            seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            ++steps;
          }
        }
        std::lock_guard lock(print_mutex);
        std::printf("# %s %s, rank %d of %d\n%s", tag.c_str(), what.c_str(), rc.group.rank(),
                    rc.group.size(), prof.table(steps, seconds).c_str());
        std::fflush(stdout);
      };
      for (size_t bi = 0; bi < o.batch.size(); ++bi) {
        const int64_t B = o.batch[bi];
        // B sequences decode together: a short prompt each, then decode_tokens greedy steps. Each
        // rank has its own B, EP 1 at batch ranks·B all of them.
        const auto reqs = rank_decode_requests(B, o.ep, rc.group.rank(), o.decode_tokens + 1, V);
        std::vector<double> tok_s;
        std::vector<int32_t> tokens;  // the last run's, padded
        for (int r = 0; r < o.reps + 1; ++r)
          in_turn([&] {
            const auto s0 = engine.stats();
            const auto results = engine.generate(reqs);
            const auto s1 = engine.stats();
            if (r == o.reps) tokens = padded_tokens(results, o.decode_tokens + 1);
            if (r > 0)
              tok_s.push_back(double(s1.decode_emitted - s0.decode_emitted) /
                              (s1.decode_seconds - s0.decode_seconds));
          });
        in_turn([&] {
          // The experts each step reads, from a recorded (untimed) run of the same greedy requests.
          auto recorded = reqs;
          for (auto& q : recorded) q.record = true;
          const double distinct =
              distinct_experts_per_step(engine.generate(recorded), kDecodePrompt, o.decode_tokens);
          if (o.profile) profile_decode(engine, reqs, fmt::format("decode batch {}", B));
          // Every rank's tokens/s of each timed run, summed: the pairs --vs-ep1 compares.
          std::vector<double> all_ranks_run = tok_s;
          rc.group.all_reduce(all_ranks_run.data(), all_ranks_run.size(), DType::f64,
                              ReduceOp::sum);
          // Every rank's tokens in rank order: EP 1's batch of all of them.
          std::vector<int32_t> all_tokens(tokens.size() * size_t(rc.group.size()));
          if (turns)
            rc.group.all_gather(tokens.data(), all_tokens.data(), tokens.size(), DType::i32);
          std::sort(tok_s.begin(), tok_s.end());
          const double tps = tok_s[tok_s.size() / 2], step_s = double(B) / tps;
          double all_ranks =
              tps;  // every rank's median, summed: compare with EP 1 at batch B·ranks
          rc.group.all_reduce(&all_ranks, 1, DType::f64, ReduceOp::sum);
          if (!lead) return;
          // The limit: the larger of the read pass before the model was loaded and one right after
          // this case (the other ranks wait in their next collective). On a shared VM one pass can
          // catch a slow minute: a single up-front pass put batch 1 at 1.38 "of the read pass".
          const double read_after = ctx.read_gbps_fresh(kernels::testing::kReadPassBytes);
          const double bw_gbps = std::max(bw_start_gbps, read_after);
          // With EP every rank runs B sequences: the step reads each rank's share of the experts,
          // and the shared weights once per rank; the figures here are rank 0's.
          const double bytes = wb.step_bytes(B, distinct);
          kernels::testing::BenchRecord d;
          d.bench = "decode";
          d.case_name = fmt::format("{} decode batch {}", tag, B);
          d.seconds = step_s;
          d.bytes = bytes;
          d.limit = "read_gbps";
          d.limit_value = bw_gbps;
          d.ratio = bytes / step_s / 1e9 / bw_gbps;
          d.extra = {{"tokens_per_s", tps},
                     {"tokens_per_s_all_ranks", all_ranks},
                     {"roofline_tokens_per_s", double(B) * bw_gbps * 1e9 / bytes},
                     {"read_gbps_start", bw_start_gbps},
                     {"read_gbps_after", read_after},
                     {"distinct_experts_per_moe_layer",
                      distinct / double(std::max<int64_t>(wb.moe_layers, 1))},
                     {"load_bucket", rc.load.mode == model::LoadMode::bucket ? 1.0 : 0.0},
                     {"load_read_bytes_max_rank", double(read_max)},
                     {"load_replicated_bytes", double(rc.load.replicated_bytes)}};
          // Each weight a step reads is multiplied by every row that uses it, so a large batch is
          // bound by the GEMMs' instruction (VDPBF16PS where the CPU has it, else FMA), not by
          // reading: the roofline is the larger of the read time and the compute time (EP 1: the
          // whole step is this rank's). At batch 1 the read time is the larger by far.
          if (o.ep == 1) {
            const double ctx_len = double(kDecodePrompt) + double(o.decode_tokens) / 2.0;
            const double attn = 2.0 * double(cfg.num_hidden_layers) *
                                double(cfg.num_attention_heads) *
                                double(2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim) * ctx_len;
            d.flops = double(B) * (linear_flops_per_token(cfg) + attn);
            const double peak = bf16_dot_gflops > 0 ? bf16_dot_gflops : peak_gflops;
            double compute_s = d.flops / (peak * 1e9);
            if (amx_gflops > 0) {  // the head at the BF16-dot peak, the rest (fp8 GEMMs) at AMX's
              const double head =
                  double(B) * 2.0 * double(cfg.hidden_size) * double(cfg.vocab_size);
              compute_s = head / (peak * 1e9) + (d.flops - head) / (amx_gflops * 1e9);
              d.extra["amx_peak_gflops"] = amx_gflops;
            }
            const double read_s = bytes / (bw_gbps * 1e9);
            d.extra["compute_peak_gflops"] = peak;
            d.extra["compute_ratio"] = compute_s / step_s;
            d.extra["roofline_ratio"] = std::max(read_s, compute_s) / step_s;
            d.extra["compute_bound"] = compute_s > read_s ? 1.0 : 0.0;
          }
          if (turns) {  // EP 1's runs of this batch are done: they came before this turn
            std::vector<double> ratios, ep1 = ep1_tok_s[bi];
            for (size_t r = 0; r < ep1.size(); ++r) ratios.push_back(all_ranks_run[r] / ep1[r]);
            std::sort(ratios.begin(), ratios.end());
            std::sort(ep1.begin(), ep1.end());
            d.extra["tokens_per_s_ep1"] = ep1[ep1.size() / 2];
            d.extra["ratio_vs_ep1"] = ratios[ratios.size() / 2];
            // The exact combine gives the same bits at every EP size (docs/ep.md), so the greedy
            // tokens must be EP 1's; the fast one may round a near tie the other way.
            const bool same = all_tokens == ep1_tokens[bi];
            d.extra["greedy_identical_ep1"] = same ? 1.0 : 0.0;
            if (knobs().ep_combine == "exact") d.correct = same;
          }
          ctx.emit(d);
        });
      }

      if (o.speculative.on()) {
        // Speculative decode (batch 1) against plain decode of the same prompt (--prompt's tokens,
        // else 16 random ids); the runs alternate, so both see the same moments of a shared
        // machine.
        std::vector<int32_t> decode_prompt = decode_requests(1, kDecodePrompt, 1, V, 101)[0].prompt;
        if (!o.prompt.empty()) decode_prompt = Tokenizer::from_dir(dir).encode(o.prompt);
        runtime::EngineOptions so = eo;
        o.speculative.apply(so);
        const std::string spec_label =
            fmt::format("speculative mtp k={}{}", o.speculative.draft_tokens,
                        so.draft_vocab ? fmt::format(" draft_vocab={}", so.draft_vocab) : "");
        runtime::Engine spec_engine(rc.weights, rc.group, so);
        std::vector<int32_t> plain_tokens, spec_tokens;
        std::vector<double> plain_s, spec_s;  // seconds per generated token
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
        for (int r = 0; r < o.reps + 1; ++r) {
          decode(engine, r, plain_s, plain_tokens, nullptr);
          decode(spec_engine, r, spec_s, spec_tokens, &spec_sum);
        }
        if (o.profile) {
          runtime::Request q;
          q.prompt = decode_prompt;
          q.max_new_tokens = o.decode_tokens + 1;
          profile_decode(spec_engine, {q}, fmt::format("decode batch 1 {}", spec_label));
        }
        DI_CHECK(spec_tokens == plain_tokens,
                 "speculative decode generated other tokens than plain greedy decode");
        if (lead) {
          std::sort(plain_s.begin(), plain_s.end());
          std::sort(spec_s.begin(), spec_s.end());
          const double dec_s = plain_s[plain_s.size() / 2], sp_s = spec_s[spec_s.size() / 2];
          kernels::testing::BenchRecord x;
          x.bench = "decode";
          x.case_name = fmt::format("{} decode batch 1 {}", tag, spec_label);
          x.seconds = sp_s;
          x.limit = "plain_decode_tokens_per_s";  // the limit it must beat
          x.limit_value = 1.0 / dec_s;
          x.ratio = dec_s / sp_s;                                                    // the speedup
          const double steps = double(spec_sum.decode_emitted - spec_sum.accepted);  // verify steps
          x.extra = {
              {"tokens_per_s", 1.0 / sp_s},
              {"speedup", dec_s / sp_s},
              {"acceptance", double(spec_sum.accepted) / std::max(1.0, double(spec_sum.drafted))},
              {"accepted_per_step", double(spec_sum.accepted) / std::max(1.0, steps)},
              {"tokens_per_step", double(spec_sum.decode_emitted) / std::max(1.0, steps)},
              {"draft_share", spec_sum.draft_seconds / std::max(1e-30, spec_sum.decode_seconds)},
              {"step_over_plain_token", spec_sum.decode_seconds / std::max(1.0, steps) / dec_s},
              {"greedy_identical", 1.0}};
          ctx.emit(x);
        }
      }
    });
  } catch (...) {
    if (turns) {
      turns->fail(0);
      ep1_thread.join();
      // The cause, not "the other world failed".
      if (turns->first_failed() == 1 && ep1_error) std::rethrow_exception(ep1_error);
    }
    throw;
  }
  if (ep1_thread.joinable()) ep1_thread.join();
  if (ep1_error) std::rethrow_exception(ep1_error);
  return 0;
}

DEEPINFER_COMMAND(
    "bench", "decode",
    "Engine prefill (vs the fp32 FMA / BF16-dot peak) and decode at batch B (vs the weight-read "
    "roofline) tokens/s; "
    "JSON lines. --model synthetic: a DeepSeek-V3-architecture model with random weights, FP8 "
    "linears as the official checkpoints",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchDecodeCli>();
      app.add_option("--model", o->model, "Model folder, or `synthetic` (default models/tiny)");
      app.add_option("--ep", o->ep, "Expert-parallel ranks (threads; default 1)")
          ->check(CLI::Range(1, 64));
      app.add_option("--threads", o->threads, "Kernel threads (default 2)")
          ->check(CLI::Range(1, 1024));
      app.add_option("--quantize", o->quantize, "fp8: quantize BF16 weights at load")
          ->check(CLI::IsMember({"fp8"}));
      app.add_option("--synthetic-dir", o->synthetic_dir,
                     "Where the synthetic model is written (reused if present; default "
                     "build/synthetic-v3-fp8)");
      app.add_option("--prompt-tokens", o->prompt_tokens, "Prefill prompt length (default 128)")
          ->check(CLI::Range(int64_t(1), int64_t(4096)));
      app.add_option("--decode-tokens", o->decode_tokens, "Decode steps per run (default 32)")
          ->check(CLI::Range(int64_t(1), int64_t(4096)));
      app.add_option("--reps", o->reps, "Timed runs; the median is reported (default 3)")
          ->check(CLI::Range(1, 100));
      app.add_option("--batch", o->batch,
                     "Sequences decoding together, one record each (default 1; e.g. 1,4,16)")
          ->delimiter(',')
          ->check(CLI::Range(int64_t(1), int64_t(256)));
      app.add_flag("--profile", o->profile,
                   "Also print each rank's decode step broken down per op and per layer (kernel "
                   "compute, pool waiting, collectives, the rest) as '#' lines");
      app.add_option("--prompt", o->prompt,
                     "Decode prompt text, tokenized with the model's tokenizer (default: 16 random "
                     "token ids)");
      app.add_flag(
          "--vs-ep1", o->vs_ep1,
          "With --ep N > 1: also load the model as EP 1 (every expert on one rank, the "
          "same threads) in this process and decode the same sequences there (batch N·B), "
          "its timed runs alternating with the EP N ones; adds tokens_per_s_ep1 and "
          "ratio_vs_ep1 (EP N's tokens/s over all ranks ÷ EP 1's, the median of the pairs)");
      app.add_option(
          "--ab", o->ab,
          "Another deepinfer binary (e.g. a build of another commit) that decodes the same "
          "sequences taking turns with this one, one step each in ABBA order: per batch, each "
          "side's median step time and ratio = the peer's over this one's (> 1: this binary is "
          "faster), and whether the greedy tokens are identical. EP 1 only");
      app.add_option("--ab-env", o->ab_env,
                     "NAME=VALUE for the --ab peer's environment (e.g. "
                     "DEEPINFER_BATCH_INVARIANT=off: A/B of a knob with one binary); repeatable")
          ->needs("--ab");
      app.add_option("--ab-peer", o->ab_peer)->group("");  // set by --ab for the peer
      o->speculative.add_to(app);
      o->head.add_to(app);
      return [o] { return run_bench_decode(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
