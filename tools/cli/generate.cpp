// `deepinfer generate`: load a DeepSeek checkpoint and generate text, streaming tokens to stdout.
// --ep N --comm local runs N ranks as threads; under `mpirun -np N ... --comm mpi` one process per
// rank. Several prompts (--prompts-file, one per line) are spread over the ranks (prompt i on rank
// i % N); each completed sequence is printed by rank 0 with its prompt index.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "command.h"
#include "core/env.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
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
};

int run_generate(const GenerateCli& o) {
  std::vector<std::string> prompts = o.prompts;
  if (!o.prompts_file.empty()) {
    std::ifstream in(o.prompts_file);
    DI_CHECK(in.good(), "cannot read --prompts-file {}", o.prompts_file);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) prompts.push_back(line);
  }
  DI_CHECK(!prompts.empty(), "no prompt: give --prompt TEXT or --prompts-file FILE");
  const Tokenizer tok = Tokenizer::from_dir(o.model);
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) {
    if (o.chat) {
      const std::vector<ChatMessage> msgs{{"user", p}};
      ids.push_back(tok.encode_chat(msgs));
    } else {
      ids.push_back(tok.encode(p));
    }
  }
  runtime::LaunchModelOptions lo;
  lo.model_dir = o.model;
  lo.ep = o.ep;
  lo.comm =
      o.comm.empty() ? comm_kind_from_knobs() : (o.comm == "mpi" ? CommKind::mpi : CommKind::local);
  lo.gemm = o.gemm == "bf16" ? model::GemmMode::bf16 : model::GemmMode::fp8;
  lo.quantize_fp8 = o.quantize == "fp8";
  lo.progress = true;
  const bool stream = prompts.size() == 1;
  std::mutex print_mu;
  runtime::run_model_ranks(lo, [&](runtime::RankContext& ctx) {
    runtime::EngineOptions eo;
    eo.model = model::ModelOptions::from_knobs();
    eo.max_tokens_per_step = o.max_tokens_per_step;
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
      r.id = int64_t(i);
      r.prompt = ids[i];
      r.max_new_tokens = o.max_tokens;
      r.sampling = {o.temperature, o.top_k, o.top_p, o.seed};
      if (!o.ignore_eos) {
        if (auto e = tok.eos_id()) r.stop_ids.push_back(*e);
        else if (ctx.weights->config.eos_token_id >= 0) r.stop_ids.push_back(int32_t(ctx.weights->config.eos_token_id));
      }
      reqs.push_back(std::move(r));
    }
    StreamDecoder sd(tok);
    if (stream && rank == 0) {
      std::lock_guard lk(print_mu);
      std::fputs(prompts[0].c_str(), stdout);
      std::fflush(stdout);
    }
    auto on_token = [&](int64_t, int32_t t) {
      if (!stream) return;
      const std::string s = sd.push(t);
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
      return;
    }
    const auto all = runtime::gather_results(ctx.group, local);
    if (rank != 0) return;
    std::lock_guard lk(print_mu);
    for (const auto& r : all) {
      const std::string text = tok.decode(r.tokens, true);
      std::fputs(fmt::format("[{}] {}{}\n", r.id, prompts[size_t(r.id)], text).c_str(), stdout);
    }
    std::fflush(stdout);
  });
  return 0;
}

DEEPINFER_COMMAND("", "generate", "Generate text from a DeepSeek checkpoint, streaming tokens to stdout",
                  [](CLI::App& app) {
                    auto o = std::make_shared<GenerateCli>();
                    app.add_option("--model", o->model, "Checkpoint folder (config.json, safetensors, tokenizer.json)")
                        ->required();
                    app.add_option("--prompt", o->prompts, "Prompt text (repeatable)");
                    app.add_option("--prompts-file", o->prompts_file, "File with one prompt per line");
                    app.add_option("--max-tokens", o->max_tokens, "New tokens per prompt (default 64)")
                        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
                    app.add_option("--temperature", o->temperature, "Sampling temperature; 0 = greedy (default)");
                    app.add_option("--top-p", o->top_p, "Nucleus sampling threshold in (0, 1] (default 1)");
                    app.add_option("--top-k", o->top_k, "Keep the k most likely tokens; 0 = all (default)");
                    app.add_option("--seed", o->seed, "Sampling seed (default 0)");
                    app.add_option("--ep", o->ep, "Expert-parallel ranks (default 1)")->check(CLI::Range(1, 1024));
                    app.add_option("--comm", o->comm, "local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
                        ->check(CLI::IsMember({"local", "mpi"}));
                    app.add_option("--algo", o->algo, "EP algorithm ag|a2a|auto (default DEEPINFER_EP_ALGO)")
                        ->check(CLI::IsMember({"ag", "a2a", "auto"}));
                    app.add_flag("--chat", o->chat, "Wrap the prompt in the DeepSeek-V3 chat format");
                    app.add_option("--gemm", o->gemm, "Linear layers: fp8 (block-scaled, default) or bf16")
                        ->check(CLI::IsMember({"fp8", "bf16"}));
                    app.add_option("--quantize", o->quantize, "fp8: quantize BF16 weights to FP8 128x128 at load")
                        ->check(CLI::IsMember({"fp8"}));
                    app.add_option("--max-step-tokens", o->max_tokens_per_step,
                                   "New tokens per forward per rank; longer prompts prefill in chunks (default 256)")
                        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
                    app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
                    return [o] { return run_generate(*o); };
                  });

}  // namespace
}  // namespace deepinfer::cli
