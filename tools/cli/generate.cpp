// `deepinfer generate`: load a DeepSeek checkpoint and generate text, streaming tokens to stdout.
// --ep N --comm local runs N ranks as threads; under `mpirun -np N` one process per rank. Several
// prompts (--prompts-file, one per line) are spread over the ranks (prompt i on rank i % N); each
// completed sequence is printed by rank 0 with its line index. Every option and every request is
// checked before anything loads, nothing reaches stdout before generation starts, and a summary
// (load time, tokens, time to first token, decode rate) ends the run on stderr.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
#include "runtime/requests.h"
#include "serve/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct GenerateCli {
  std::string model;
  std::vector<std::string> prompts;
  std::string prompts_file;
  int64_t max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int ep = 1;
  std::string comm;
  std::string algo;
  bool chat = false;
  std::string gemm = "fp8";
  std::string quantize;
  int64_t max_tokens_per_step = 256;
  bool ignore_eos = false;
  SpeculativeOptions speculative;
  HeadOption head;
};

const runtime::SamplingNames kSamplingNames{"--temperature", "--top-k", "--top-p"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Everything that can be checked without loading the weights: the options, the model folder,
// the prompts and every request against config.json.
struct Prepared {
  std::vector<runtime::Prompt> prompts;
  std::vector<std::vector<int32_t>> ids;
  Tokenizer tok;
  CommKind comm;
};

Prepared prepare(const GenerateCli& o) {
  if (auto p = runtime::sampling_problem({o.temperature, o.top_k, o.top_p, o.seed}, kSamplingNames);
      !p.empty())
    DI_USAGE("{}", p);
  if (o.gemm == "bf16" && o.quantize == "fp8")
    DI_USAGE(
        "--gemm bf16 and --quantize fp8 contradict each other: --quantize fp8 makes FP8 weights "
        "for the fp8 "
        "GEMMs, while --gemm bf16 runs every linear layer in BF16. Drop one of them");
  const CommKind comm = resolve_comm(o.comm);
  check_mpi_world(comm, o.ep, "--ep");
  try {
    model::check_model_dir(o.model);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  std::vector<runtime::Prompt> prompts;
  for (size_t i = 0; i < o.prompts.size(); ++i) prompts.push_back({int64_t(i), o.prompts[i]});
  if (!o.prompts_file.empty()) {
    try {
      prompts = runtime::read_prompts_file(o.prompts_file, std::cin);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  if (prompts.empty())
    DI_USAGE(
        "no prompt: give --prompt TEXT, or --prompts-file FILE with one prompt per line (- for "
        "stdin)");
  const model::ModelConfig cfg = model::load_config(o.model);
  Tokenizer tok = Tokenizer::from_dir(o.model);
  std::optional<serve::ChatFormat> chat;
  if (o.chat) {
    try {
      chat.emplace(tok);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--chat: {}", e.what()));
    }
  }
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) {
    if (chat) {
      const std::vector<ChatMessage> msgs{{"user", p.text}};
      ids.push_back(chat->encode(msgs));
    } else {
      ids.push_back(tok.encode(p.text));
    }
    runtime::Request r;
    r.prompt = ids.back();
    r.max_new_tokens = o.max_tokens;
    r.sampling = {o.temperature, o.top_k, o.top_p, o.seed};
    if (auto problem = runtime::request_problem(r, cfg.vocab_size, cfg.max_position_embeddings,
                                                kSamplingNames);
        !problem.empty()) {
      const std::string which =
          !o.prompts_file.empty() ? fmt::format("--prompts-file line {}", p.index + 1)
          : prompts.size() == 1   ? std::string("--prompt")
                                  : fmt::format("--prompt number {}", p.index + 1);
      DI_USAGE("{}: {}; shorten the prompt or lower --max-tokens", which, problem);
    }
  }
  return {std::move(prompts), std::move(ids), std::move(tok), comm};
}

int run_generate(const GenerateCli& o) {
  const auto t_start = std::chrono::steady_clock::now();
  const Prepared pre = prepare(o);
  const auto& prompts = pre.prompts;
  const Tokenizer& tok = pre.tok;
  runtime::LaunchModelOptions lo;
  lo.model_dir = o.model;
  lo.ep = o.ep;
  lo.world_option = "--ep";
  lo.comm = pre.comm;
  lo.gemm = o.gemm == "bf16" ? model::GemmMode::bf16 : model::GemmMode::fp8;
  lo.quantize_fp8 = o.quantize == "fp8";
  lo.progress = true;
  lo.mtp = o.speculative.on();
  lo.fp8_head = o.head.fp8();
  const bool stream = prompts.size() == 1;
  int64_t prompt_tokens = 0;
  for (const auto& v : pre.ids) prompt_tokens += int64_t(v.size());
  std::mutex print_mu;
  std::atomic<bool> echoed{false};
  runtime::run_model_ranks(lo, [&](runtime::RankContext& ctx) {
    const double load_s = seconds_since(t_start);
    const auto t_gen = std::chrono::steady_clock::now();
    runtime::EngineOptions eo;
    eo.model = model::ModelOptions::from_knobs();
    eo.max_tokens_per_step = o.max_tokens_per_step;
    o.speculative.apply(eo);
    if (!o.algo.empty())
      eo.model.ep.algo = o.algo == "ag"    ? EpAlgo::ag
                         : o.algo == "a2a" ? EpAlgo::a2a
                                           : EpAlgo::automatic;
    runtime::Engine engine(ctx.weights, ctx.group, eo);
    std::vector<runtime::Request> reqs;
    const int W = ctx.group.size(), rank = ctx.group.rank();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (int(i % size_t(W)) != rank) continue;
      runtime::Request r;
      r.id = prompts[i].index;
      r.prompt = pre.ids[i];
      r.max_new_tokens = o.max_tokens;
      r.sampling = {o.temperature, o.top_k, o.top_p, o.seed};
      if (!o.ignore_eos) {
        if (auto e = tok.eos_id())
          r.stop_ids.push_back(*e);
        else if (ctx.weights->config.eos_token_id >= 0)
          r.stop_ids.push_back(int32_t(ctx.weights->config.eos_token_id));
      }
      reqs.push_back(std::move(r));
    }
    StreamDecoder sd(tok);
    double first_token_s = -1;  // this rank's
    int64_t generated = 0;
    auto on_token = [&](int64_t, int32_t t) {
      if (first_token_s < 0) first_token_s = seconds_since(t_gen);
      ++generated;
      if (!stream) return;
      std::string s = sd.push(t);
      // The prompt is echoed with the first token: by then the engine has accepted the request.
      if (!echoed.exchange(true)) s = prompts[0].text + s;
      std::lock_guard lk(print_mu);
      std::fputs(s.c_str(), stdout);
      std::fflush(stdout);
    };
    const auto local = engine.generate(reqs, on_token);
    if (stream) {
      if (rank == 0) {
        std::lock_guard lk(print_mu);
        std::fputs((sd.flush() + "\n").c_str(), stdout);
        std::fflush(stdout);
      }
    } else {
      const auto all = runtime::gather_results(ctx.group, local);
      if (rank == 0) {
        std::map<int64_t, const std::string*> text_of;
        for (const auto& p : prompts) text_of[p.index] = &p.text;
        std::lock_guard lk(print_mu);
        for (const auto& r : all) {
          const std::string text = tok.decode(r.tokens, true);
          std::fputs(fmt::format("[{}] {}{}\n", r.id, *text_of.at(r.id), text).c_str(), stdout);
        }
        std::fflush(stdout);
      }
    }
    // The summary: tokens summed over the ranks, the earliest first token, the slowest rank's end.
    int64_t counts[2] = {generated, int64_t(local.size())};
    ctx.group.all_reduce(counts, 2, DType::i64, ReduceOp::sum);
    double times[2] = {first_token_s < 0 ? 1e300 : first_token_s, seconds_since(t_gen)};
    ctx.group.all_reduce(&times[0], 1, DType::f64, ReduceOp::min);
    ctx.group.all_reduce(&times[1], 1, DType::f64, ReduceOp::max);
    if (rank != 0) return;
    const int64_t decoded = counts[0] - counts[1];  // tokens after each sequence's first
    const double decode_s = times[1] - times[0];
    std::string rate = decoded > 0 && decode_s > 0
                           ? fmt::format("{:.1f} tokens/s", double(decoded) / decode_s)
                           : "n/a";
    std::fprintf(stderr,
                 "generate: load %.2f s, %lld prompt tokens, %lld generated, first token after "
                 "%.3f s, decode %s\n",
                 load_s, static_cast<long long>(prompt_tokens), static_cast<long long>(counts[0]),
                 times[0] < 1e300 ? times[0] : 0.0, rate.c_str());
  });
  return 0;
}

DEEPINFER_COMMAND(
    "", "generate", "Generate text from a DeepSeek checkpoint, streaming tokens to stdout",
    [](CLI::App& app) {
      auto o = std::make_shared<GenerateCli>();
      app.add_option("--model", o->model,
                     "Checkpoint folder (config.json, safetensors, tokenizer.json)")
          ->required();
      auto* prompt = app.add_option("--prompt", o->prompts,
                                    "Prompt text (repeatable; output [i] is the i-th)");
      app.add_option(
             "--prompts-file", o->prompts_file,
             "File with one prompt per line, - for stdin; output [i] is line i counting from 0 "
             "(empty lines hold no prompt but keep their number; CRLF is fine)")
          ->excludes(prompt);
      app.add_option("--max-tokens", o->max_tokens, "New tokens per prompt (default 64)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_option("--temperature", o->temperature,
                     "Sampling temperature >= 0; 0 = greedy (default)")
          ->check(a_number());
      app.add_option("--top-p", o->top_p, "Nucleus sampling threshold in (0, 1] (default 1)")
          ->check(a_number());
      app.add_option("--top-k", o->top_k,
                     "Keep the k most likely tokens, k >= 0; 0 = all (default)")
          ->check(integer_in(INT32_MIN, INT32_MAX, "INT >= 0"));
      app.add_option("--seed", o->seed, "Sampling seed (default 0)")
          ->check(integer_in(0, INT64_MAX, "INT >= 0"));
      app.add_option("--ep", o->ep,
                     "Expert-parallel ranks (default 1; under mpirun, the processes)")
          ->check(integer_in(1, 1024));
      app.add_option("--comm", o->comm,
                     "local (threads) or mpi (one process per rank); default: mpi when started by "
                     "mpirun/srun with several processes, else DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--algo", o->algo, "EP algorithm ag|a2a|auto (default DEEPINFER_EP_ALGO)")
          ->check(CLI::IsMember({"ag", "a2a", "auto"}));
      app.add_flag("--chat", o->chat,
                   "Wrap the prompt as a user message in the model's chat template "
                   "(tokenizer_config.json), or the DeepSeek-V3 format without one");
      app.add_option("--gemm", o->gemm, "Linear layers: fp8 (block-scaled, default) or bf16")
          ->check(CLI::IsMember({"fp8", "bf16"}));
      app.add_option("--quantize", o->quantize,
                     "fp8: quantize BF16 weights to FP8 128x128 at load (for --gemm fp8)")
          ->check(CLI::IsMember({"fp8"}));
      app.add_option("--max-step-tokens", o->max_tokens_per_step,
                     "New tokens per forward per rank; longer prompts prefill in "
                     "chunks (default 256)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
      o->speculative.add_to(app);
      o->head.add_to(app);
      return [o] { return run_generate(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
