// `deepinfer check engram`: the EngramBuffer matrix (src/ep/engram/check_engram.h) on `local`
// (--world threads) or under mpirun (--comm mpi), optionally through a faulty backend. Last line
// `engram: N passed, M failed`; exit code 1 on any failure.
#include "ep/engram/check_engram.h"

#include <deepinfer/comm.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "runtime/launch.h"

namespace deepinfer::cli {
namespace {

struct CheckEngramCli {
  std::string comm;
  int world = 0;
  std::string fault;
  double timeout_s = 0;
  uint64_t seed = 1;
  bool verbose = false;
};

int run_check_engram_cli(const CheckEngramCli& o) {
  LaunchOptions lo;
  lo.comm = resolve_comm(o.comm);
  lo.world = o.world > 0 ? o.world : (lo.comm == CommKind::local ? 4 : 0);
  lo.fault = o.fault;
  lo.timeout_s = o.timeout_s;
  ep::engram::CheckEngramOptions co;
  co.seed = o.seed;
  co.verbose = o.verbose;
  return run_check_suite<ep::engram::CheckEngramResult>(
      lo, "engram", [&](Group& g) { return ep::engram::run_check_engram(g, co); });
}

DEEPINFER_COMMAND(
    "check", "engram",
    "EngramBuffer matrix: every fetch lowering x bf16/fp8 + scale factors x index patterns "
    "(duplicates, -1, one owner, T = 0, J = 32, n prime) bit-exact against a host reference, and "
    "agreed errors; last line `engram: N passed, M failed`",
    [](CLI::App& app) {
      auto o = std::make_shared<CheckEngramCli>();
      app.add_option("--comm", o->comm,
                     "Backend: local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--world", o->world,
                     "Ranks: local threads (default 4); mpi checks it against mpirun -np")
          ->check(CLI::Range(1, 1024));
      std::vector<std::string> faults;
      for (const auto& f : fault_names()) faults.emplace_back(f.first);
      app.add_option("--fault", o->fault,
                     "Run through a faulty backend (it reports no peer memory, and no trusted "
                     "all_to_all_v where it breaks it): the lowerings left must still pass")
          ->check(CLI::IsMember(faults));
      app.add_option("--timeout", o->timeout_s,
                     "Deadline of each collective in seconds (default DEEPINFER_COMM_TIMEOUT_S)")
          ->check(CLI::PositiveNumber);
      app.add_option("--seed", o->seed, "Seed of the generated tables and indices (default 1)");
      app.add_flag("--verbose", o->verbose, "One line per case");
      return [o] { return run_check_engram_cli(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
