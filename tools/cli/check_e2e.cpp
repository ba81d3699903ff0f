// `deepinfer check e2e`: the end-to-end golden check (docs/architecture.md §7, docs/numerics.md
// §11). Runs the golden prompts of a model folder (golden/golden.json, written by the independent
// PyTorch reference) through the engine at EP N: prefill of the prompt ids, then greedy decode of
// max_new_tokens, and compares
//  - fp32 logits at every position: ‖a−b‖/‖b‖ <= --tol (per position);
//  - argmax: equal wherever the golden top-1/top-2 margin exceeds --margin-tol (100%);
//  - greedy tokens: identical to the golden continuation;
//  - routing: the selected experts of every MoE layer equal the golden's wherever the golden
//    router margin exceeds --router-tol; the smallest router margin seen is reported;
//  - --speculative mtp (docs/architecture.md §6.1): decoding speculates with the MTP module, and
//    its logits at every position (within --tol), its argmax (the golden's mtp_draft_top1 where
//    the margin exceeds --margin-tol) and the verify steps (the reference's trace for k) are
//    checked too; the main logits, hence the hash, are those of plain decode.
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

// --ablate: the smallest max |Δ logits| that counts as "the part acts" (fp32 logits of the same
// computation are bit-identical, so any real effect is far above it).
constexpr double kAblateMinDelta = 1e-3;

struct CheckE2eCli {
  std::string model;
  int ep = 1;
  std::string comm;
  std::string algo;
  std::string combine;
  double tol = 5e-3;         // per-position relative L2 error of the logits
  double margin_tol = 0.05;  // logit units: argmax must agree where the golden margin exceeds it
  double router_tol = 1e-3;  // router decisions must agree where the golden margin exceeds it
  double mtp_tol = -1;       // per-position relative L2 error of the MTP logits (< 0: --tol)
  std::string expect_hash;
  bool verbose = false;
  SpeculativeOptions speculative;
  HeadOption head;
  std::string ablate;  // "" | engram | comb: also run prompt 0 with that part switched off
};

// An ablation of the reference's golden (golden.json "ablations"): prompt 0's golden sequence with
// the Engram tables zeroed, or every mHC comb the identity.
struct GoldenAblation {
  std::string name;
  std::vector<float> logits;  // [positions, V]
  int64_t positions = 0;
  int64_t prompt = 0;
  double max_abs_delta = 0;  // the reference's max |ablated − normal|
};

// One verify step of the reference's speculative trace (golden "speculative"/k "steps").
struct GoldenStep {
  std::vector<int32_t> drafts;
  std::vector<float> draft_margins;
  int64_t accepted = 0;
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
  // MTP (models with an MTP module): per position t the module's logits for token t + 2, their
  // argmax and top-1/top-2 margin, and the speculative trace for --draft-tokens k if present.
  std::vector<float> mtp_logits;  // [T, V]
  std::vector<int32_t> mtp_top1;
  std::vector<float> mtp_margins;
  std::vector<GoldenStep> steps;
  bool has_steps = false;
};

std::vector<float> read_f32(const std::string& path, int64_t n) {
  std::ifstream li(path, std::ios::binary);
  DI_CHECK(li.good(), "cannot read {}", path);
  std::vector<float> v(static_cast<size_t>(n));
  li.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  DI_CHECK(li.gcount() == std::streamsize(v.size() * sizeof(float)), "{}: truncated ({} floats)",
           path, n);
  return v;
}

std::vector<GoldenPrompt> read_golden(const std::string& dir, int64_t& vocab, int64_t& max_new,
                                      int64_t draft_tokens, const std::string& ablate,
                                      GoldenAblation& ablation) {
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
  if (!ablate.empty()) {
    if (!j.contains("ablations") || !j.at("ablations").contains(ablate))
      DI_USAGE(
          "--ablate {}: {} has no ablation golden for '{}' (golden.json \"ablations\"); give a "
          "model folder whose golden tools/reference/write_golden.py wrote for an Engram/mHC model "
          "(models/tiny-engram)",
          ablate, path, ablate);
    const auto& a = j.at("ablations").at(ablate);
    const auto shape = a.at("logits_shape").get<std::vector<int64_t>>();
    DI_CHECK(shape.size() == 2 && shape[1] == vocab, "{}: ablation {} logits_shape mismatch", path,
             ablate);
    ablation.name = ablate;
    ablation.positions = shape[0];
    ablation.prompt = a.at("prompt_index").get<int64_t>();
    ablation.max_abs_delta = a.at("max_abs_delta").get<double>();
    ablation.logits =
        read_f32(dir + "/golden/" + a.at("logits_file").get<std::string>(), shape[0] * vocab);
  }
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
    g.logits =
        read_f32(dir + "/golden/" + p.at("logits_file").get<std::string>(), g.positions * vocab);
    if (draft_tokens > 0) {
      if (!p.contains("mtp_logits_file"))
        DI_USAGE(
            "--speculative mtp: {} has no MTP golden (mtp_logits_file); give a model folder whose "
            "golden tools/reference/write_golden.py wrote with its MTP module (models/tiny-mtp)",
            path);
      // T - 1 rows: position t reads token t + 1 of the golden sequence.
      g.mtp_logits = read_f32(dir + "/golden/" + p.at("mtp_logits_file").get<std::string>(),
                              (g.positions - 1) * vocab);
      g.mtp_top1 = p.at("mtp_draft_top1").get<std::vector<int32_t>>();
      g.mtp_margins = p.at("mtp_margins").get<std::vector<float>>();
      const std::string k = std::to_string(draft_tokens);
      if (p.contains("speculative") && p.at("speculative").contains(k)) {
        g.has_steps = true;
        for (const auto& st : p.at("speculative").at(k).at("steps"))
          g.steps.push_back({st.at("drafts").get<std::vector<int32_t>>(),
                             st.at("draft_margins").get<std::vector<float>>(),
                             st.at("accepted").get<int64_t>()});
      }
    }
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

// Per position: ‖a−b‖/‖b‖ and the argmax where the golden top-1/top-2 margin exceeds margin_tol.
struct LogitsCompare {
  double max_rel = 0;
  int64_t worst_pos = 0, argmax_bad = 0, argmax_checked = 0;
  std::vector<double> rel;  // per position
  int64_t over(double tol) const {
    return std::count_if(rel.begin(), rel.end(), [&](double r) { return !(r <= tol); });
  }
  void report(const char* what, double tol, std::vector<std::string>& problems) const {
    if (!(max_rel <= tol))
      problems.push_back(fmt::format("{} rel err {:.3e} at position {} > tol {:.1e} ({} of {})",
                                     what, max_rel, worst_pos, tol, over(tol), rel.size()));
    if (argmax_bad)
      problems.push_back(fmt::format("{} argmax differs at {}/{} confident positions", what,
                                     argmax_bad, argmax_checked));
  }
};

LogitsCompare compare_logits(const float* mine, const float* gold, int64_t positions, int64_t vocab,
                             const std::vector<float>& margins, const CheckE2eCli& o) {
  LogitsCompare c;
  for (int64_t t = 0; t < positions; ++t) {
    const float* a = mine + t * vocab;
    const float* b = gold + t * vocab;
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
    c.rel.push_back(rel);
    if (!(rel <= c.max_rel)) {
      c.max_rel = rel;
      c.worst_pos = t;
    }
    if (margins[size_t(t)] > o.margin_tol) {
      ++c.argmax_checked;
      if (am != bm) ++c.argmax_bad;
    }
  }
  return c;
}

// The engine's verify steps against the reference's speculative trace: the same number of steps,
// each step's drafts equal while the reference's draft margins are clear (a chain draft after an
// unclear one may differ), and the same accepted count where every draft was clear and the engine
// verified as many as the reference (the last step's drafts are cut to max_new_tokens).
void check_steps(const runtime::RequestResult& r, const GoldenPrompt& g, const CheckE2eCli& o,
                 std::vector<std::string>& problems) {
  if (!g.has_steps) return;
  const size_t n = r.spec_steps.size() / 2;
  if (n != g.steps.size()) {
    problems.push_back(fmt::format("{} verify steps, the reference's trace {}", n, g.steps.size()));
    return;
  }
  int64_t bad = 0, off = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t nd = r.spec_steps[2 * i], acc = r.spec_steps[2 * i + 1];
    const GoldenStep& gs = g.steps[i];
    bool clear = true;
    for (int64_t j = 0; j < nd && j < int64_t(gs.drafts.size()) && clear; ++j) {
      clear = gs.draft_margins[size_t(j)] > o.margin_tol;
      if (clear && r.drafts[size_t(off + j)] != gs.drafts[size_t(j)]) ++bad;
    }
    if (clear && nd == int64_t(gs.drafts.size()) && acc != gs.accepted) ++bad;
    off += nd;
  }
  if (bad)
    problems.push_back(
        fmt::format("{} draft or acceptance differences vs the reference's "
                    "speculative trace",
                    bad));
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
  const int64_t k = o.speculative.engine_draft_tokens();
  GoldenAblation ablation;
  const auto golden = read_golden(o.model, vocab, max_new, k, o.ablate, ablation);
  // The ablated run: the golden sequence of the ablation's prompt (ids + generated, the positions
  // of its logits), teacher-forced in one request of max_new_tokens 1.
  std::vector<int32_t> ablate_seq;
  if (!o.ablate.empty()) {
    const model::ModelConfig c = model::load_config(o.model);
    if (o.ablate == "engram" && !c.engram.enabled())
      DI_USAGE("--ablate engram: {} has no Engram blocks (config.json \"engram\")", o.model);
    if (o.ablate == "comb" && c.hc_mult == 1)
      DI_USAGE("--ablate comb: {} has no mHC branches (config.json hc_mult is 1)", o.model);
    DI_CHECK(ablation.prompt >= 0 && ablation.prompt < int64_t(golden.size()),
             "ablation prompt {} of {}", ablation.prompt, golden.size());
    const GoldenPrompt& g = golden[size_t(ablation.prompt)];
    ablate_seq = g.ids;
    ablate_seq.insert(ablate_seq.end(), g.generated.begin(), g.generated.end());
    DI_CHECK(ablation.positions >= 1 && ablation.positions <= int64_t(ablate_seq.size()),
             "ablation covers {} positions of a {}-token sequence", ablation.positions,
             ablate_seq.size());
    ablate_seq.resize(size_t(ablation.positions));
  }
  runtime::RequestResult ablated;
  runtime::LaunchModelOptions lo;
  lo.model_dir = o.model;
  lo.ep = o.ep;
  lo.comm = comm;
  lo.mtp = o.speculative.on();
  lo.fp8_head = o.head.fp8();
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
    eo.draft_tokens = k;
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
    if (!o.ablate.empty()) {
      runtime::EngineOptions ea = eo;
      ea.model.ablate_engram = o.ablate == "engram";
      ea.model.ablate_comb = o.ablate == "comb";
      runtime::Engine ablate_engine(ctx.weights, ctx.group, ea);
      std::vector<runtime::Request> one;
      if (ctx.group.rank() == 0) {
        runtime::Request r;
        r.prompt = ablate_seq;
        r.max_new_tokens = 1;
        r.record = true;
        one.push_back(std::move(r));
      }
      auto res = ablate_engine.generate(one);
      if (ctx.group.rank() == 0) ablated = std::move(res.at(0));
    }
    if (ctx.group.rank() == 0) {
      results = std::move(all);
      printer = true;
    }
  });
  if (!printer) return 0;  // mpi ranks other than 0

  int passed = 0, failed = 0;
  uint64_t hash = 14695981039346656037ull;
  float min_router_margin = std::numeric_limits<float>::infinity();
  double worst_rel = 0, worst_mtp_rel = 0;
  int64_t drafts_checked = 0, drafts_bad = 0, drafted = 0, accepted = 0, mtp_over = 0, mtp_rows = 0;
  const double mtp_tol = o.mtp_tol < 0 ? o.tol : o.mtp_tol;
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
      const LogitsCompare lc =
          compare_logits(r.logits.data(), g.logits.data(), g.positions, vocab, g.margins, o);
      worst_rel = std::max(worst_rel, lc.max_rel);
      lc.report("logits", o.tol, problems);
      if (o.verbose)
        std::printf("  prompt %zu: max rel err %.3e (position %lld), argmax %lld/%lld\n", i,
                    lc.max_rel, static_cast<long long>(lc.worst_pos),
                    static_cast<long long>(lc.argmax_checked - lc.argmax_bad),
                    static_cast<long long>(lc.argmax_checked));
      if (k > 0) {
        // The MTP module at every position: logits within the tolerance, argmax = the golden's
        // draft where its margin is clear.
        // The engine runs the module at every position (the last one too, reading the last
        // generated token); the golden's T - 1 rows stop before it.
        const int64_t mp = g.positions - 1;
        if (int64_t(r.mtp_logits.size()) != g.positions * vocab) {
          problems.push_back(fmt::format("{} MTP logits rows, expected {}",
                                         int64_t(r.mtp_logits.size()) / vocab, g.positions));
        } else {
          const LogitsCompare mc =
              compare_logits(r.mtp_logits.data(), g.mtp_logits.data(), mp, vocab, g.mtp_margins, o);
          worst_mtp_rel = std::max(worst_mtp_rel, mc.max_rel);
          mc.report("MTP logits", mtp_tol, problems);
          mtp_over += mc.over(o.tol);
          mtp_rows += mp;
          for (int64_t t = 0; t < mp; ++t) {
            if (g.mtp_margins[size_t(t)] <= o.margin_tol) continue;
            const float* a = r.mtp_logits.data() + t * vocab;
            ++drafts_checked;
            if (std::max_element(a, a + vocab) - a != g.mtp_top1[size_t(t)]) ++drafts_bad;
          }
        }
        check_steps(r, g, o, problems);
        for (size_t st = 0; st + 1 < r.spec_steps.size(); st += 2) {
          drafted += r.spec_steps[st];
          accepted += r.spec_steps[st + 1];
        }
      }
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
  if (k > 0) {
    std::printf(
        "MTP: worst logits rel err %.3e (tol %.1e; %lld of %lld positions above --tol %.1e); "
        "drafts = golden mtp_draft_top1 at %lld/%lld confident positions; acceptance %.3f (%lld "
        "of %lld drafts, k = %lld)\n",
        worst_mtp_rel, mtp_tol, static_cast<long long>(mtp_over), static_cast<long long>(mtp_rows),
        o.tol, static_cast<long long>(drafts_checked - drafts_bad),
        static_cast<long long>(drafts_checked),
        double(accepted) / double(std::max<int64_t>(drafted, 1)), static_cast<long long>(accepted),
        static_cast<long long>(drafted), static_cast<long long>(k));
  }
  if (!o.ablate.empty()) {
    // The ablated logits against the reference's, and how far they moved from the normal run: a
    // part that does nothing would leave them where they were.
    const int64_t P = ablation.positions;
    const auto& normal = results[size_t(ablation.prompt)].logits;
    std::vector<std::string> problems;
    if (ablated.num_positions != P || int64_t(normal.size()) < P * vocab) {
      problems.push_back(fmt::format("{} ablated positions, golden {}", ablated.num_positions, P));
    } else {
      std::vector<float> margins(static_cast<size_t>(P));  // of the reference's ablated logits
      for (int64_t t = 0; t < P; ++t) {
        const float* b = ablation.logits.data() + t * vocab;
        std::vector<float> row(b, b + vocab);
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
        margins[size_t(t)] = row[0] - row[1];
      }
      const LogitsCompare lc =
          compare_logits(ablated.logits.data(), ablation.logits.data(), P, vocab, margins, o);
      lc.report("ablated logits", o.tol, problems);
      double delta = 0;
      for (int64_t i = 0; i < P * vocab; ++i)
        delta = std::max(delta, std::fabs(double(ablated.logits[size_t(i)]) - normal[size_t(i)]));
      std::printf(
          "ablate %s (prompt %lld, %lld positions): max |Δ logits| vs the normal run %.4g "
          "(reference %.4g); ablated logits rel err %.3e vs the reference's\n",
          o.ablate.c_str(), static_cast<long long>(ablation.prompt), static_cast<long long>(P),
          delta, ablation.max_abs_delta, lc.max_rel);
      if (!(delta > kAblateMinDelta && delta >= 0.5 * ablation.max_abs_delta))
        problems.push_back(fmt::format(
            "switching off {} moved the logits by only {:.3g} (reference {:.3g}): it does not act",
            o.ablate, delta, ablation.max_abs_delta));
    }
    if (problems.empty()) {
      ++passed;
      std::printf("PASS ablate %s\n", o.ablate.c_str());
    } else {
      ++failed;
      std::string all;
      for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
      std::printf("FAIL ablate %s: %s\n", o.ablate.c_str(), all.c_str());
    }
  }
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
      app.add_option("--mtp-tol", o->mtp_tol,
                     "With --speculative: the MTP logits' ‖a−b‖/‖b‖ tolerance (default --tol)");
      app.add_option(
          "--margin-tol", o->margin_tol,
          "Argmax must agree where the golden top-1/top-2 margin exceeds this (default 0.05)");
      app.add_option(
          "--router-tol", o->router_tol,
          "Routing must agree where the golden router margin exceeds this (default 1e-3)");
      app.add_option("--expect-hash", o->expect_hash, "Fail unless the logits hash equals this");
      app.add_flag("--verbose", o->verbose, "Per-prompt error figures");
      o->speculative.add_to(app, false);
      o->head.add_to(app);
      app.add_option("--ablate", o->ablate,
                     "Also run prompt 0 with the Engram tables zeroed (engram) or every mHC comb "
                     "the identity (comb), against the reference's ablation golden, and print how "
                     "far its logits moved")
          ->check(CLI::IsMember({"engram", "comb"}));
      return [o] { return run_check_e2e(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
