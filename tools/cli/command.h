// CLI command registry: each `deepinfer <group> <name>` lives in its own file and registers
// itself with DEEPINFER_COMMAND, so adding a command never edits main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace deepinfer::cli {

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

}  // namespace deepinfer::cli

#define DEEPINFER_CONCAT_(a, b) a##b
#define DEEPINFER_CONCAT(a, b) DEEPINFER_CONCAT_(a, b)
// DEEPINFER_COMMAND("check", "collectives", "help text", [](CLI::App& app) { ...; return [=] { return 0; }; });
#define DEEPINFER_COMMAND(group, name, help, setup)                   \
  static const bool DEEPINFER_CONCAT(deepinfer_command_, __LINE__) = \
      ::deepinfer::cli::register_command({group, name, help, setup})
