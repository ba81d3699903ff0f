// `deepinfer check ep`: the EPBuffer matrix (src/ep/check_ep.h) on `local` (--world threads) or
// under mpirun (--comm mpi), optionally through a faulty backend. Last line:
// `ep: N passed, M failed`; exit code 1 on any failure.
#include "ep/check_ep.h"

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "core/env.h"
#include "runtime/launch.h"

namespace deepinfer::cli {
namespace {

struct CheckEpCli {
  std::string comm;
  int world = 0;
  std::string algo = "all";
  std::string combine = "all";
  std::string fault;
  double timeout_s = 0;
  uint64_t seed = 1;
  bool verbose = false;
  bool full = false;
  int hidden = 0;
  int tokens = 0;
};

int run_check_ep_cli(const CheckEpCli& o) {
  LaunchOptions lo;
  lo.comm = resolve_comm(o.comm);
  lo.world = o.world > 0 ? o.world : (lo.comm == CommKind::local ? 4 : 0);
  lo.fault = o.fault;
  lo.timeout_s = o.timeout_s;
  ep::CheckEpOptions co;
  co.policy = EPConfig::from_knobs();
  co.seed = o.seed;
  co.verbose = o.verbose;
  co.full = o.full;
  co.hidden = o.hidden;
  co.tokens = o.tokens;
  if (o.algo != "all")
    co.algos = {o.algo == "ag" ? EpAlgo::ag : (o.algo == "a2a" ? EpAlgo::a2a : EpAlgo::automatic)};
  if (o.combine != "all")
    co.combines = {o.combine == "fast" ? CombineMode::fast : CombineMode::exact};
  return run_check_suite<ep::CheckEpResult>(lo, "ep",
                                            [&](Group& g) { return ep::run_check_ep(g, co); });
}

DEEPINFER_COMMAND(
    "check", "ep",
    "EPBuffer matrix: algorithms x bf16/fp8 x alignment x expand x cached x ag rows/reduce/chunk x "
    "combine exact/fast on uneven routing, bit-exact against a host reference; last line "
    "`ep: N passed, M failed`",
    [](CLI::App& app) {
      auto o = std::make_shared<CheckEpCli>();
      app.add_option("--comm", o->comm,
                     "Backend: local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--world", o->world,
                     "Ranks: local threads (default 4); mpi checks it against mpirun -np")
          ->check(CLI::Range(1, 1024));
      app.add_option("--algo", o->algo, "ag, a2a, auto or all (default all)")
          ->check(CLI::IsMember({"ag", "a2a", "auto", "all"}));
      app.add_option("--combine", o->combine, "exact, fast or all (default all)")
          ->check(CLI::IsMember({"exact", "fast", "all"}));
      std::vector<std::string> faults;
      std::string fault_list;
      for (const auto& f : fault_names()) {
        faults.emplace_back(f.first);
        fault_list += (fault_list.empty() ? "" : ", ") + std::string(f.first);
      }
      app.add_option("--fault", o->fault, "Run through a faulty backend: " + fault_list)
          ->check(CLI::IsMember(faults));
      app.add_option("--timeout", o->timeout_s,
                     "Deadline of each collective in seconds (default DEEPINFER_COMM_TIMEOUT_S)")
          ->check(CLI::PositiveNumber);
      app.add_option("--seed", o->seed, "Seed of the generated inputs (default 1)");
      app.add_flag("--verbose", o->verbose, "One line per case");
      app.add_flag("--full", o->full, "No pruning of the ag variants at large worlds");
      app.add_option("--hidden", o->hidden,
                     "Hidden size of every case (default: small, by world); e.g. 8192 makes the "
                     "a2a calls large "
                     "enough for their bandwidth lowerings")
          ->check(CLI::Range(1, 1 << 16));
      app.add_option(
             "--tokens", o->tokens,
             "Max tokens per rank M of every case (default: small, by world); with --hidden 8192, "
             "--tokens 1024 makes a2a dispatch past 32 MiB a call, where on local the sources "
             "write")
          ->check(CLI::Range(1, 1 << 16));
      return [o] { return run_check_ep_cli(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
