// The `deepinfer` command: check, bench, generate, diff. Commands register themselves
// (command.h); this file only builds the CLI11 tree and runs the chosen one.
#include <deepinfer/error.h>
#include <deepinfer/tensor.h>

#include <cstdio>
#include <map>

#include "command.h"
#include "core/env.h"
#include "kernels/registry.h"

namespace deepinfer::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

bool register_command(CommandSpec spec) {
  command_registry().push_back(std::move(spec));
  return true;
}

}  // namespace deepinfer::cli

int main(int argc, char** argv) {
  using namespace deepinfer;
  keep_freed_host_memory();
  CLI::App app{"deepinfer: DeepSeek-architecture MoE inference with expert parallelism over any collective backend"};
  app.require_subcommand(1);
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
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 2;
  }
  try {
    return runner ? runner() : 0;
  } catch (const CommTimeout& e) {
    std::fprintf(stderr, "deepinfer: timeout: %s\n", e.what());
    return 3;
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer: internal error: %s\n", e.what());
    return 1;
  }
}
