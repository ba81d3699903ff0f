// CLI command registry: each `deepinfer <group> <name>` lives in its own file and registers
// itself with DEEPINFER_COMMAND, so adding a command never edits main.cpp.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/error.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/check.h"
#include "runtime/launch.h"

namespace deepinfer::cli {

// Runs a check suite on every rank of `lo` and prints rank 0's `NAME: N passed, M failed` line
// (the check commands' common tail). Result has `passed` and `failed`. Exit code 1 on a failure.
// --head bf16|fp8: the LM head's precision (LoadOptions::fp8_head).
struct HeadOption {
  std::string precision = "bf16";
  void add_to(CLI::App& app);
  bool fp8() const { return precision == "fp8"; }
};

template <class Result>
int run_check_suite(const LaunchOptions& lo, const char* name,
                    const std::function<Result(Group&)>& suite);

// Adds the command's options to `app` and returns the function that runs it (exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandSpec {
  std::string group;  // "check", "bench", or "" for a top-level command ("generate", "diff")
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandSpec>& command_registry();
bool register_command(CommandSpec spec);

// A mistake in how the command was called, found after parsing (e.g. two options that
// contradict each other): printed without a source location, exit code 2 like a parse error.
class UsageError : public Error {
 public:
  using Error::Error;
};
#define DI_USAGE(...) throw ::deepinfer::cli::UsageError(fmt::format(__VA_ARGS__))

// Option checks whose messages say what the option expects ("--max-tokens: expects an integer
// in [1, 1048576], got 'abc'"); CLI11 prefixes the option name the user typed.
CLI::Validator integer_in(int64_t lo, int64_t hi,
                          const std::string& help = "");  // help: "INT >= 0"
CLI::Validator a_number();

// The backend for a command whose --comm option holds `typed` ("" if not given), from the
// option, DEEPINFER_COMM and the launch: mpi under a launch of several processes, where an
// explicit local is a UsageError.
CommKind resolve_comm(const std::string& typed);

// Before anything loads: under mpi, `world` ranks given by `option` (e.g. --ep) need a launch
// of exactly that many processes (world <= 1 takes the launch's size). A UsageError otherwise.
void check_mpi_world(CommKind comm, int world, const std::string& option);

// `--speculative mtp [--draft-tokens k]` (docs/architecture.md §6.1), the same on every command
// that runs the engine.
struct SpeculativeOptions {
  std::string mode;  // "" (plain decode) or "mtp"
  int64_t draft_tokens = 2;
  int64_t draft_vocab = 0;  // EngineOptions::draft_vocab (0: the whole vocabulary)
  // with_vocab: also --draft-vocab (not where the MTP logits are checked whole: check e2e).
  void add_to(CLI::App& app, bool with_vocab = true);
  bool on() const { return mode == "mtp"; }
  int64_t engine_draft_tokens() const { return on() ? draft_tokens : 0; }  // EngineOptions'
  // Both speculation settings onto engine options (EngineOptions, serve::ServeOptions).
  template <class Options>
  void apply(Options& o) const {
    o.draft_tokens = engine_draft_tokens();
    o.draft_vocab = on() ? draft_vocab : 0;
  }
};

template <class Result>
int run_check_suite(const LaunchOptions& lo, const char* name,
                    const std::function<Result(Group&)>& suite) {
  Result res;
  bool printer = false;
  runtime::run_ranks_with_pools(lo, [&](Group& g) {
    const Result r = suite(g);
    if (g.rank() == 0) {
      res = r;
      printer = true;
    }
  });
  if (printer) {
    std::printf("%s: %d passed, %d failed\n", name, res.passed, res.failed);
    std::fflush(stdout);
  }
  return res.failed ? 1 : 0;
}

}  // namespace deepinfer::cli

#define DEEPINFER_CONCAT_(a, b) a##b
#define DEEPINFER_CONCAT(a, b) DEEPINFER_CONCAT_(a, b)
// DEEPINFER_COMMAND("check", "collectives", "help text", [](CLI::App& app) { ...; return [=] {
// return 0; }; });
#define DEEPINFER_COMMAND(group, name, help, setup)                  \
  static const bool DEEPINFER_CONCAT(deepinfer_command_, __LINE__) = \
      ::deepinfer::cli::register_command({group, name, help, setup})
