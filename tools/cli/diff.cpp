// `deepinfer diff`: run the model with the diff recorder on — every kernel call is replayed on the
// `host` reference from copies of its inputs as it happens and compared — then print the calls
// ranked by error and a per-op summary. Exit 1 when any call exceeds its tolerance or has NaN/inf.
// Under EP each rank diffs its own calls and rank 0 merges the tables (all_gather_v).
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "core/env.h"
#include "core/paths.h"
#include "kernels/diff/diff_recorder.h"
#include "kernels/registry.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

namespace kd = kernels::diff;

struct DiffCli {
  std::string model;
  std::vector<std::string> prompts;
  bool golden = false;
  int ep = 1;
  std::string comm;
  std::string backend = "cpu";
  int top = 20;
  std::string json;
  int64_t max_tokens = 4;
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    DI_USAGE("cannot read {}: --golden needs the model's golden/prompts.txt (models/tiny has one)",
             path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

int run_diff(const DiffCli& o) {
  // Everything a user can get wrong is checked here, before a run that may take minutes.
  if (!o.json.empty())
    if (auto problem = output_file_problem(o.json); !problem.empty())
      DI_USAGE("--json {}: {}", o.json, problem);
  try {
    model::check_model_dir(o.model);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  std::vector<std::string> prompts = o.prompts;
  if (o.golden) {
    const auto g = read_lines(o.model + "/golden/prompts.txt");
    prompts.insert(prompts.end(), g.begin(), g.end());
  }
  if (prompts.empty()) DI_USAGE("no prompt: give --prompt TEXT or --golden");

  Knobs k = knobs();
  k.kernels = o.backend == "host" ? "host" : "cpu";
  set_knobs(k);  // before any rank or pool thread reads the knobs

  const Tokenizer tok = Tokenizer::from_dir(o.model);
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) ids.push_back(tok.encode(p));

  runtime::LaunchModelOptions lo;
  lo.model_dir = o.model;
  lo.ep = o.ep;
  lo.comm = resolve_comm(o.comm);
  check_mpi_world(lo.comm, o.ep, "--ep");

  kd::DiffRecorder rec;
  std::atomic<int> exit_code{0};
  runtime::run_model_ranks(lo, [&](runtime::RankContext& ctx) {
    Group& g = ctx.group;
    const int rank = g.rank(), W = g.size();
    kd::DiffRankScope bind(rec, rank);
    // One process-wide recorder: with rank threads only rank 0 installs it, between barriers so
    // every rank's calls (and no loading calls) are recorded.
    const bool installer = lo.comm == CommKind::mpi || rank == 0;
    std::optional<kernels::ScopedRecorder> on;
    g.barrier();
    if (installer) on.emplace(&rec);
    g.barrier();
    kernels::reset_call_counters();  // call indices (and DEEPINFER_FAULT's) count from here
    {
      runtime::EngineOptions eo;
      eo.model = model::ModelOptions::from_knobs();
      runtime::Engine engine(ctx.weights, g, eo);
      std::vector<runtime::Request> reqs;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (int(i % size_t(W)) != rank) continue;
        runtime::Request r;
        r.id = int64_t(i);
        r.prompt = ids[i];
        r.max_new_tokens = o.max_tokens;
        reqs.push_back(std::move(r));
      }
      engine.generate(reqs);
    }
    g.barrier();
    if (installer) on.reset();
    g.barrier();
    const auto rows = kd::gather_diff_rows(g, rec.rows(rank));
    if (rank != 0) return;
    const kd::DiffReport rep = kd::make_report(rows);
    const kd::ReportOptions ro{.top = o.top};
    std::fputs(
        fmt::format(
            "deepinfer diff: {} backend vs host, {} prompt(s), {} new token(s) each, {} rank(s)\n",
            o.backend, prompts.size(), o.max_tokens, W)
            .c_str(),
        stdout);
    std::fputs(kd::format_report(rep, ro).c_str(), stdout);
    std::fflush(stdout);
    if (!o.json.empty()) {
      std::ofstream out(o.json);
      out << kd::report_json(rep, ro);
      out.close();
      if (!out)
        DI_FAIL("--json {}: writing the report failed ({}); the report above is complete", o.json,
                std::strerror(errno));
    }
    exit_code = rep.ok() ? 0 : 1;
  });
  return exit_code.load();
}

DEEPINFER_COMMAND(
    "", "diff", "Replay every kernel call of a run on the host reference and rank kernels by error",
    [](CLI::App& app) {
      auto o = std::make_shared<DiffCli>();
      app.add_option("--model", o->model,
                     "Checkpoint folder (config.json, safetensors, tokenizer.json)")
          ->required();
      app.add_option("--prompt", o->prompts, "Prompt text (repeatable)");
      app.add_flag("--golden", o->golden, "Use the model's golden/prompts.txt");
      app.add_option("--ep", o->ep, "Expert-parallel ranks (default 1)")
          ->check(integer_in(1, 1024));
      app.add_option("--comm", o->comm,
                     "local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--backend", o->backend,
                     "Backend under test: cpu (default) or host (self-check)")
          ->check(CLI::IsMember({"cpu", "host"}));
      app.add_option("--top", o->top, "Calls listed in the ranking (default 20)")
          ->check(integer_in(0, 1 << 20));
      app.add_option("--json", o->json, "Also write the report as JSON to FILE");
      app.add_option("--max-tokens", o->max_tokens, "New tokens per prompt (default 4)")
          ->check(integer_in(1, int64_t(1) << 20));
      return [o] { return run_diff(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
