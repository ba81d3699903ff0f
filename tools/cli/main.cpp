// The `deepinfer` command: check, bench, generate, tokenize, diff. Commands register themselves
// (command.h); this file only builds the CLI11 tree, runs the chosen one and turns its errors
// into messages and exit codes (0 ok, 1 failed, 2 a usage error, 3 a collective timed out).
#include <deepinfer/error.h>
#include <deepinfer/tensor.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "comm/platform.h"
#include "command.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/registry.h"

#ifndef DEEPINFER_VERSION
#error "DEEPINFER_VERSION comes from the CMake project version (tools/cli/CMakeLists.txt)"
#endif

namespace deepinfer::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

bool register_command(CommandSpec spec) {
  command_registry().push_back(std::move(spec));
  return true;
}

CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& help) {
  const std::string desc = help.empty() ? fmt::format("INT in [{} - {}]", lo, hi) : help;
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range ||
            (ec == std::errc() && p == s.data() + s.size() && (v < lo || v > hi)))
          return fmt::format("expects an integer in [{}, {}], got {}", lo, hi, s);
        if (ec != std::errc() || p != s.data() + s.size() || s.empty())
          return fmt::format("expects an integer in [{}, {}], got '{}', which is not an integer",
                             lo, hi, s);
        return {};
      },
      desc);
}

CLI::Validator a_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
          return fmt::format("expects a number, got '{}'", s);
        return {};
      },
      "NUMBER");
}

void SpeculativeOptions::add_to(CLI::App& app, bool with_vocab) {
  auto* spec = app.add_option("--speculative", mode,
                              "mtp: self-speculative decoding with the model's MTP module (same "
                              "output as without; needs num_nextn_predict_layers >= 1)")
                   ->check(CLI::IsMember({"mtp"}));
  app.add_option("--draft-tokens", draft_tokens,
                 "MTP drafts verified per step with --speculative mtp (default 2)")
      ->check(integer_in(1, 16))
      ->needs(spec);
  if (with_vocab)
    app.add_option("--draft-vocab", draft_vocab,
                   "MTP drafts from the first N token ids only (their head rows are all a draft "
                   "reads of the head; output unchanged; default: the whole vocabulary)")
        ->check(integer_in(1, int64_t(1) << 40, "INT >= 1"))
        ->needs(spec);
}

void HeadOption::add_to(CLI::App& app) {
  app.add_option("--head", precision,
                 "LM head precision: bf16 (default, as checkpoints ship it) or fp8 (128x128 "
                 "blocks: half the head's bytes per token, logits change; docs/performance.md §8)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
}

CommKind resolve_comm(const std::string& typed) {
  std::optional<CommKind> option, env;
  if (!typed.empty()) option = typed == "mpi" ? CommKind::mpi : CommKind::local;
  if (std::getenv("DEEPINFER_COMM")) env = comm_kind_from_knobs();
  try {
    return choose_comm(option, "--comm", env, CommKind::local, multi_process_launch());
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

void check_mpi_world(CommKind comm, int world, const std::string& option) {
  if (comm != CommKind::mpi || world <= 1) return;
  const auto launch = multi_process_launch();
  if (!launch)
    DI_USAGE(
        "{0} {1} with --comm mpi needs {1} processes, one per rank, but this one was not started "
        "by "
        "mpirun: launch it as `mpirun -np {1} deepinfer ...`, or use --comm local to run {1} rank "
        "threads in this process",
        option, world);
  if (launch->processes != world)
    DI_USAGE(
        "{0} {1} but mpirun started {2} processes: use `mpirun -np {1}`, or drop {0} (the launch "
        "sets it)",
        option, world, launch->processes);
}

namespace {

// Under mpirun every process finds the same usage error; rank 0 alone says it.
bool other_rank_of_a_launch() {
  try {
    const auto p = launcher_placement();
    return p && p->rank != 0;
  } catch (const Error&) {
    return false;
  }
}

// "generate, tokenize, diff, check collectives|ep|kernels|e2e, bench ..."
// Sorted by name, so the list does not depend on the order the command files are linked in.
std::vector<const CLI::App*> sorted_subcommands(const CLI::App& app) {
  std::vector<const CLI::App*> subs = app.get_subcommands({});
  std::sort(subs.begin(), subs.end(),
            [](const CLI::App* a, const CLI::App* b) { return a->get_name() < b->get_name(); });
  return subs;
}

std::string command_list(const CLI::App& app) {
  std::string s;
  for (const CLI::App* sub : sorted_subcommands(app)) {
    if (!s.empty()) s += ", ";
    s += sub->get_name();
    std::string inner;
    for (const CLI::App* leaf : sorted_subcommands(*sub))
      inner += (inner.empty() ? " " : "|") + leaf->get_name();
    s += inner;
  }
  return s;
}

const CLI::App* find_sub(const CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == name) return sub;
  return nullptr;
}

// CLI11 answers a missing or unknown command word with "A subcommand is required"; this names the
// word the user typed and lists the commands. Returns an exit code, or -1 to go on parsing.
int check_command_words(const CLI::App& app, int argc, char** argv) {
  auto is_option = [](const char* a) { return a[0] == '-'; };
  if (argc < 2) {
    std::fprintf(
        stderr,
        "deepinfer: no command given; the commands are: %s\nRun `deepinfer --help` for more.\n",
        command_list(app).c_str());
    return 2;
  }
  if (is_option(argv[1])) return -1;
  const CLI::App* sub = find_sub(app, argv[1]);
  if (!sub) {
    std::fprintf(
        stderr,
        "deepinfer: unknown command '%s'; the commands are: %s\nRun `deepinfer --help` for more.\n",
        argv[1], command_list(app).c_str());
    return 2;
  }
  if (sub->get_subcommands({}).empty()) return -1;
  const std::string leaves = command_list(*sub);
  if (argc < 3 ||
      (is_option(argv[2]) && std::string(argv[2]) != "--help" && std::string(argv[2]) != "-h")) {
    std::fprintf(
        stderr,
        "deepinfer %s: which one? the commands are: %s\nRun `deepinfer %s --help` for more.\n",
        argv[1], leaves.c_str(), argv[1]);
    return 2;
  }
  if (!is_option(argv[2]) && !find_sub(*sub, argv[2])) {
    std::fprintf(stderr,
                 "deepinfer %s: unknown command '%s'; the commands are: %s\nRun `deepinfer %s "
                 "--help` for more.\n",
                 argv[1], argv[2], leaves.c_str(), argv[1]);
    return 2;
  }
  return -1;
}

}  // namespace
}  // namespace deepinfer::cli

int main(int argc, char** argv) {
  using namespace deepinfer;
  keep_freed_host_memory();
  CLI::App app{
      "deepinfer: DeepSeek-architecture MoE inference with expert parallelism over any collective "
      "backend"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("deepinfer ") + DEEPINFER_VERSION,
                       "Print the version and exit");
  bool help_env = false;
  app.add_flag("--help-env", help_env, "List the DEEPINFER_* environment knobs and exit");

  std::map<std::string, CLI::App*> groups;
  const std::map<std::string, std::string> group_help = {
      {"check", "Verification suites: collectives, ep, kernels, e2e"},
      {"bench", "Benchmarks (JSON lines with a ratio to a limit measured in the same run)"}};
  std::function<int()> runner;
  for (auto& spec : cli::command_registry()) {
    CLI::App* parent = &app;
    if (!spec.group.empty()) {
      auto it = groups.find(spec.group);
      if (it == groups.end()) {
        auto h = group_help.count(spec.group) ? group_help.at(spec.group) : spec.group;
        it = groups.emplace(spec.group, app.add_subcommand(spec.group, h)).first;
        it->second->require_subcommand(1);
      }
      parent = it->second;
    }
    CLI::App* sub = parent->add_subcommand(spec.name, spec.help);
    auto run = std::make_shared<std::function<int()>>();
    *run = spec.setup(*sub);
    sub->callback([&runner, run] { runner = *run; });
  }
  if (argc >= 2 && std::string(argv[1]) == "--help-env") {
    for (const auto& k : knob_docs())
      std::printf("%-28s %-24s default %-10s %s\n", k.name, k.allowed, k.def, k.meaning);
    return 0;
  }
  try {
    knobs();  // validate the environment before anything starts
    kernels::check_fault_knob();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (cli::other_rank_of_a_launch()) return 2;
    if (const int rc = cli::check_command_words(app, argc, argv); rc >= 0) return rc;
    app.exit(e);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 2;
  }
  try {
    return runner ? runner() : 0;
  } catch (const CommTimeout& e) {
    std::fprintf(stderr, "deepinfer: timeout: %s\n", e.what());
    return 3;
  } catch (const cli::UsageError& e) {
    if (!cli::other_rank_of_a_launch()) std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 2;
  } catch (const InternalError& e) {
    std::fprintf(stderr,
                 "deepinfer: internal error (a bug; please report it with the command line): %s\n",
                 e.what());
    return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "deepinfer: internal error (a bug; please report it with the command line): %s\n",
                 e.what());
    return 1;
  }
}
