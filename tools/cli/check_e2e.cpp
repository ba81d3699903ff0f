// `deepinfer check e2e`: the end-to-end golden check (docs/architecture.md §7, docs/numerics.md
// §11). Runs the golden prompts of a model folder (golden/golden.json, written by the independent
// PyTorch reference) through the engine at EP N: prefill of the prompt ids, then greedy decode of
// max_new_tokens, and compares
//  - fp32 logits at every position: ‖a−b‖/‖b‖ <= --tol (per position);
//  - argmax: equal wherever the golden top-1/top-2 margin exceeds --margin-tol (100%);
//  - greedy tokens: identical to the golden continuation;
//  - routing: the selected experts of every MoE layer equal the golden's wherever the golden
//    router margin exceeds --router-tol; the smallest router margin seen is reported.
// It prints a hash of all logits (FNV-1a over the fp32 bytes, prompt order): with `exact`
// combine the hash must be identical across EP sizes and algorithms (scripts/stages/e2e.sh
// compares it; --expect-hash makes this run fail on a different hash). Last line
// `e2e: N passed, M failed`; exit code 1 on any failure.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "core/env.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/launch.h"

namespace deepinfer::cli {
namespace {

struct CheckE2eCli {
  std::string model;
  int ep = 1;
  std::string comm;
  std::string algo;
  std::string combine;
  double tol = 5e-3;         // per-position relative L2 error of the logits
  double margin_tol = 0.05;  // logit units: argmax must agree where the golden margin exceeds it
  double router_tol = 1e-3;  // router decisions must agree where the golden margin exceeds it
  std::string expect_hash;
  bool verbose = false;
};

struct GoldenPrompt {
  int64_t index = 0;
  std::vector<int32_t> ids, generated;
  std::vector<float> logits;  // [T, V]
  int64_t positions = 0;
  std::vector<float> margins;
  std::vector<int64_t> moe_layers;
  std::vector<std::vector<int64_t>> routing;  // per MoE layer [T, K]
  std::vector<std::vector<float>> router_margins;
};

std::vector<GoldenPrompt> read_golden(const std::string& dir, int64_t& vocab, int64_t& max_new) {
  const std::string path = dir + "/golden/golden.json";
  std::ifstream in(path);
  if (!in)
    DI_USAGE(
        "--model {} has no golden data ({} is missing): check e2e compares against golden/ written "
        "by "
        "tools/reference/write_golden.py; give a model folder that has it (models/tiny does)",
        dir, path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    DI_FAIL("{}: invalid JSON: {}", path, e.what());
  }
  DI_CHECK(j.value("format", "") == "deepinfer-golden-1", "{}: unknown format {}", path,
           j.value("format", "?"));
  vocab = j.at("vocab_size").get<int64_t>();
  max_new = j.at("max_new_tokens").get<int64_t>();
  std::vector<GoldenPrompt> out;
  for (const auto& p : j.at("prompts")) {
    GoldenPrompt g;
    g.index = p.at("index").get<int64_t>();
    g.ids = p.at("ids").get<std::vector<int32_t>>();
    g.generated = p.at("generated_ids").get<std::vector<int32_t>>();
    g.positions = p.at("num_positions").get<int64_t>();
    g.margins = p.at("margins").get<std::vector<float>>();
    const auto shape = p.at("logits_shape").get<std::vector<int64_t>>();
    DI_CHECK(shape.size() == 2 && shape[0] == g.positions && shape[1] == vocab,
             "{}: prompt {} logits_shape mismatch", path, g.index);
    const std::string lf = dir + "/golden/" + p.at("logits_file").get<std::string>();
    std::ifstream li(lf, std::ios::binary);
    DI_CHECK(li.good(), "cannot read {}", lf);
    g.logits.resize(size_t(g.positions * vocab));
    li.read(reinterpret_cast<char*>(g.logits.data()),
            std::streamsize(g.logits.size() * sizeof(float)));
    DI_CHECK(li.gcount() == std::streamsize(g.logits.size() * sizeof(float)),
             "{}: truncated ({} positions x {} expected)", lf, g.positions, vocab);
    if (p.contains("routing")) {
      for (const auto& [layer, r] : p.at("routing").items()) {
        g.moe_layers.push_back(std::stoll(layer));
        std::vector<int64_t> flat;
        for (const auto& row : r.at("experts"))
          for (const auto& e : row) flat.push_back(e.get<int64_t>());
        g.routing.push_back(std::move(flat));
        g.router_margins.push_back(r.at("margins").get<std::vector<float>>());
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

int run_check_e2e(const CheckE2eCli& o) {
  const CommKind comm = resolve_comm(o.comm);
  check_mpi_world(comm, o.ep, "--ep");
  try {
    model::check_model_dir(o.model);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  int64_t vocab = 0, max_new = 0;
  const auto golden = read_golden(o.model, vocab, max_new);
  runtime::LaunchModelOptions lo;
  lo.model_dir = o.model;
  lo.ep = o.ep;
  lo.comm = comm;
  std::vector<runtime::RequestResult> results;
  bool printer = false;
  runtime::run_model_ranks(lo, [&](runtime::RankContext& ctx) {
    runtime::EngineOptions eo;
    eo.model = model::ModelOptions::from_knobs();
    if (!o.algo.empty())
      eo.model.ep.algo = o.algo == "ag"    ? EpAlgo::ag
                         : o.algo == "a2a" ? EpAlgo::a2a
                                           : EpAlgo::automatic;
    if (!o.combine.empty())
      eo.model.ep.combine = o.combine == "fast" ? CombineMode::fast : CombineMode::exact;
    DI_CHECK(ctx.weights->config.vocab_size == vocab, "golden vocab {} != model vocab {}", vocab,
             ctx.weights->config.vocab_size);
    runtime::Engine engine(ctx.weights, ctx.group, eo);
    std::vector<runtime::Request> reqs;
    for (size_t i = 0; i < golden.size(); ++i) {
      if (int(i % size_t(ctx.group.size())) != ctx.group.rank()) continue;
      runtime::Request r;
      r.id = int64_t(i);
      r.prompt = golden[i].ids;
      r.max_new_tokens = max_new;
      r.record = true;  // greedy, no stop tokens (as the golden)
      reqs.push_back(std::move(r));
    }
    const auto local = engine.generate(reqs);
    auto all = runtime::gather_results(ctx.group, local);
    if (ctx.group.rank() == 0) {
      results = std::move(all);
      printer = true;
    }
  });
  if (!printer) return 0;  // mpi ranks other than 0

  int passed = 0, failed = 0;
  uint64_t hash = 14695981039346656037ull;
  float min_router_margin = std::numeric_limits<float>::infinity();
  double worst_rel = 0;
  DI_CHECK(results.size() == golden.size(), "got {} results for {} prompts", results.size(),
           golden.size());
  for (size_t i = 0; i < golden.size(); ++i) {
    const auto& g = golden[i];
    const auto& r = results[i];
    std::vector<std::string> problems;
    hash = fnv1a(hash, r.logits.data(), r.logits.size() * sizeof(float));
    min_router_margin = std::min(min_router_margin, r.min_router_margin);
    if (r.num_positions != g.positions) {
      problems.push_back(fmt::format("{} positions, golden {}", r.num_positions, g.positions));
    } else {
      double max_rel = 0;
      int64_t worst_pos = 0, argmax_bad = 0, argmax_checked = 0;
      for (int64_t t = 0; t < g.positions; ++t) {
        const float* a = r.logits.data() + t * vocab;
        const float* b = g.logits.data() + t * vocab;
        double num = 0, den = 0;
        bool nan = false;
        int64_t am = 0, bm = 0;
        for (int64_t v = 0; v < vocab; ++v) {
          if (!std::isfinite(a[v])) nan = true;
          num += (double(a[v]) - b[v]) * (double(a[v]) - b[v]);
          den += double(b[v]) * b[v];
          if (a[v] > a[am]) am = v;
          if (b[v] > b[bm]) bm = v;
        }
        const double rel =
            nan ? std::numeric_limits<double>::infinity() : std::sqrt(num / std::max(den, 1e-30));
        if (!(rel <= max_rel)) {
          max_rel = rel;
          worst_pos = t;
        }
        if (g.margins[size_t(t)] > o.margin_tol) {
          ++argmax_checked;
          if (am != bm) ++argmax_bad;
        }
      }
      worst_rel = std::max(worst_rel, max_rel);
      if (!(max_rel <= o.tol))
        problems.push_back(fmt::format("logits rel err {:.3e} at position {} > tol {:.1e}", max_rel,
                                       worst_pos, o.tol));
      if (argmax_bad)
        problems.push_back(
            fmt::format("argmax differs at {}/{} confident positions", argmax_bad, argmax_checked));
      if (o.verbose)
        std::printf("  prompt %zu: max rel err %.3e (position %lld), argmax %lld/%lld\n", i,
                    max_rel, static_cast<long long>(worst_pos),
                    static_cast<long long>(argmax_checked - argmax_bad),
                    static_cast<long long>(argmax_checked));
      // Routing.
      const int64_t K =
          g.routing.empty() ? 0 : int64_t(g.routing[0].size()) / std::max<int64_t>(g.positions, 1);
      int64_t route_bad = 0, route_checked = 0;
      for (size_t l = 0; l < g.moe_layers.size(); ++l) {
        const auto it = std::find(r.moe_layers.begin(), r.moe_layers.end(), g.moe_layers[l]);
        if (it == r.moe_layers.end()) {
          problems.push_back(fmt::format("no routing recorded for MoE layer {}", g.moe_layers[l]));
          continue;
        }
        const auto& mine = r.routing[size_t(it - r.moe_layers.begin())];
        for (int64_t t = 0; t < g.positions; ++t) {
          if (g.router_margins[l][size_t(t)] <= o.router_tol) continue;
          ++route_checked;
          std::vector<int64_t> a(mine.begin() + t * K, mine.begin() + (t + 1) * K);
          std::vector<int64_t> b(g.routing[l].begin() + t * K, g.routing[l].begin() + (t + 1) * K);
          std::sort(a.begin(), a.end());
          std::sort(b.begin(), b.end());
          if (a != b) ++route_bad;
        }
      }
      if (route_bad)
        problems.push_back(fmt::format("routing differs at {}/{} decisive (token, layer) pairs",
                                       route_bad, route_checked));
    }
    if (r.tokens != g.generated)
      problems.push_back("greedy tokens differ from the golden continuation");
    if (problems.empty()) {
      ++passed;
      std::printf("PASS prompt %zu (%lld positions)\n", i, static_cast<long long>(g.positions));
    } else {
      ++failed;
      std::string all;
      for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
      std::printf("FAIL prompt %zu: %s\n", i, all.c_str());
    }
  }
  std::printf("worst logits rel err %.3e (tol %.1e); smallest router margin %.3e\n", worst_rel,
              o.tol, double(min_router_margin));
  const std::string hs = fmt::format("{:016x}", hash);
  std::printf("logits hash: %s\n", hs.c_str());
  if (!o.expect_hash.empty()) {
    if (hs == o.expect_hash) {
      ++passed;
      std::printf("PASS logits bit-identical to the expected hash\n");
    } else {
      ++failed;
      std::printf(
          "FAIL logits hash %s != expected %s (exact combine must be bit-identical across EP "
          "sizes)\n",
          hs.c_str(), o.expect_hash.c_str());
    }
  }
  std::printf("e2e: %d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed ? 1 : 0;
}

DEEPINFER_COMMAND(
    "check", "e2e",
    "End-to-end golden check: logits, greedy tokens and routing of the golden prompts vs the "
    "PyTorch reference; last line `e2e: N passed, M failed`",
    [](CLI::App& app) {
      auto o = std::make_shared<CheckE2eCli>();
      app.add_option("--model", o->model, "Model folder with golden/ (default models/tiny)")
          ->default_val("models/tiny");
      app.add_option("--ep", o->ep, "Expert-parallel ranks (default 1)")
          ->check(integer_in(1, 1024));
      app.add_option("--comm", o->comm, "local or mpi (default DEEPINFER_COMM)")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--algo", o->algo, "EP algorithm ag|a2a|auto (default DEEPINFER_EP_ALGO)")
          ->check(CLI::IsMember({"ag", "a2a", "auto"}));
      app.add_option("--combine", o->combine, "exact|fast (default DEEPINFER_EP_COMBINE)")
          ->check(CLI::IsMember({"exact", "fast"}));
      app.add_option("--tol", o->tol,
                     "Per-position ‖a−b‖/‖b‖ tolerance of the logits (default 5e-3)");
      app.add_option(
          "--margin-tol", o->margin_tol,
          "Argmax must agree where the golden top-1/top-2 margin exceeds this (default 0.05)");
      app.add_option(
          "--router-tol", o->router_tol,
          "Routing must agree where the golden router margin exceeds this (default 1e-3)");
      app.add_option("--expect-hash", o->expect_hash, "Fail unless the logits hash equals this");
      app.add_flag("--verbose", o->verbose, "Per-prompt error figures");
      return [o] { return run_check_e2e(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
