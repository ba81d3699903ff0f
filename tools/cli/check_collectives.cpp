// `deepinfer check collectives`: the collective conformance suite (docs/architecture.md §3, §7) on
// the `local` backend (--world threads) or under mpirun (--comm mpi), optionally through a fault.
#include <deepinfer/comm.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/capabilities.h"
#include "comm/conformance/conformance.h"
#include "comm/faulty/faulty_group.h"
#include "comm/platform.h"
#include "command.h"
#include "core/check.h"
#include "core/env.h"

namespace deepinfer::cli {
namespace {

// Exit codes, as main.cpp uses them: 1 = a case failed, 3 = a collective timed out.
constexpr int kExitFailed = 1;
constexpr int kExitTimeout = 3;
constexpr int kDefaultLocalWorld = 4;

struct CheckOptions {
  std::string comm;
  int world = 0;
  std::string fault;
  double timeout_s = 0;
  std::string capabilities_file;
  bool quick = false;
  bool full = false;
  conformance::SuiteOptions suite() const {
    return {quick  ? conformance::Coverage::quick
            : full ? conformance::Coverage::full
                   : conformance::Coverage::standard};
  }
};

// "0-2,4,6-15"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += i == j ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return s;
}

void print(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

void save(const CheckOptions& o, const conformance::SuiteReport& r) {
  if (o.capabilities_file.empty()) return;
  save_capabilities(o.capabilities_file, r.verified, r.backend);
  print(fmt::format("collectives: wrote {}: all_to_all {}, all_to_all_v {}, ordered_reduce {}\n",
                    o.capabilities_file, r.verified.all_to_all, r.verified.all_to_all_v,
                    r.verified.ordered_reduce));
}

int exit_code(const conformance::SuiteReport& r) {
  if (r.stop.stopped && r.stop.timeout) return kExitTimeout;
  return r.ok() ? 0 : kExitFailed;
}

// local: every rank's report is here; rank 0's table is printed, and the ranks that stopped
// differently from rank 0 get one line per (kind, place) so a dead or hung rank is named.
// Should rank 0 have returned early, its report still ends the run: a stop makes the exit code.
int run_local(const CheckOptions& o, const LaunchOptions& lo) {
  std::vector<conformance::SuiteReport> reports(static_cast<size_t>(lo.world));
  try {
    run_ranks(lo, [&](Group& g) {
      auto& r = reports[size_t(g.rank())] = conformance::run_suite(g, o.suite());
      // Rethrown so run_ranks sees how this rank ended: a timeout or error breaks the world so
      // the peers stop at once; a dead rank (rank-exit) stays silent and the peers time out.
      if (r.stop.stopped) std::rethrow_exception(r.stop.error);
    });
  } catch (const std::exception&) {
    // Every rank's report says what happened; printed below.
  }
  const conformance::SuiteReport& r0 = reports[0];
  std::map<std::string, std::vector<int>> stops;  // line -> ranks
  bool any_timeout = false, all_ok = true;
  for (const auto& r : reports) {
    all_ok &= r.ok();
    any_timeout |= r.stop.stopped && r.stop.timeout;
    if (r.rank == 0 || !r.stop.stopped) continue;
    if (r0.stop.stopped && r.stop.timeout == r0.stop.timeout && r.stop.where == r0.stop.where)
      continue;
    stops[fmt::format("{} in {}: {}", r.stop.timeout ? "timed out" : "stopped after an error",
                      r.stop.where, r.stop.message)]
        .push_back(r.rank);
  }
  std::vector<std::string> extra;
  for (const auto& [line, ranks] : stops)
    extra.push_back(fmt::format("collectives: rank{} {} {}", ranks.size() > 1 ? "s" : "",
                                rank_list(ranks), line));
  print(conformance::format_report(r0, extra));
  save(o, r0);
  if (any_timeout) return kExitTimeout;
  return all_ok ? 0 : kExitFailed;
}

// mpi: this process is one rank. Rank 0 prints the table; a rank that stopped says where; a
// stop is rethrown so run_ranks aborts the job instead of finalising over pending requests.
int run_mpi(const CheckOptions& o, const LaunchOptions& lo) {
  int code = 0;
  run_ranks(lo, [&](Group& g) {
    conformance::SuiteReport r = conformance::run_suite(g, o.suite());
    if (r.rank == 0) {
      print(conformance::format_report(r));
      save(o, r);
    } else if (r.stop.stopped) {
      print(fmt::format("collectives: rank {} {} in {}: {}\n", r.rank,
                        r.stop.timeout ? "timed out" : "stopped after an error", r.stop.where,
                        r.stop.message));
    }
    code = exit_code(r);
    if (r.stop.stopped) std::rethrow_exception(r.stop.error);
  });
  return code;
}

int run_check(const CheckOptions& o) {
  LaunchOptions lo;
  lo.comm = resolve_comm(o.comm);
  lo.world = o.world > 0 ? o.world : (lo.comm == CommKind::local ? kDefaultLocalWorld : 0);
  lo.fault = o.fault;
  lo.timeout_s = o.timeout_s;
  if (!o.fault.empty()) {
    // The suite must fail under a fault; one that cannot act at this size would let it pass.
    int world = lo.world;
    if (lo.comm == CommKind::mpi)
      world = o.world > 0 ? o.world : (launcher_placement() ? launcher_placement()->world : 1);
    const int min_world = comm::fault_min_world(o.fault);
    if (world < min_world)
      DI_USAGE(
          "--fault {} acts only at world sizes >= {}, so at {} {} the suite would pass; use {}",
          o.fault, min_world, lo.comm == CommKind::mpi && o.world == 0 ? "mpirun -np" : "--world",
          world,
          lo.comm == CommKind::mpi ? fmt::format("mpirun -np {} (or more)", min_world)
                                   : fmt::format("--world {} (or more)", min_world));
  }
  return lo.comm == CommKind::local ? run_local(o, lo) : run_mpi(o, lo);
}

DEEPINFER_COMMAND(
    "check", "collectives",
    "Conformance suite: every collective op x dtype x size (0, 1, odd, >= 1 MiB) x split, payloads "
    "attributed to (source rank, index); prints a table and `collectives: N passed, M failed`",
    [](CLI::App& app) {
      auto o = std::make_shared<CheckOptions>();
      app.add_option("--comm", o->comm,
                     "Backend: local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option(
             "--world", o->world,
             fmt::format("Ranks: local threads (default {}); mpi checks it against mpirun -np",
                         kDefaultLocalWorld))
          ->check(integer_in(1, 1024));
      std::vector<std::string> faults;
      std::string fault_help =
          "Inject a fault; the suite must then fail (each acts only from some world size up; see "
          "README):";
      for (const auto& f : fault_names()) {
        faults.emplace_back(f.first);
        fault_help += " " + faults.back();
      }
      app.add_option("--fault", o->fault, fault_help)->check(CLI::IsMember(faults));
      app.add_option("--timeout", o->timeout_s,
                     "Deadline of each collective in seconds (default DEEPINFER_COMM_TIMEOUT_S)")
          ->check(CLI::PositiveNumber);
      app.add_option(
          "--save-capabilities", o->capabilities_file,
          "Write the all_to_all lowerings that passed to FILE (use with DEEPINFER_CAPABILITIES)");
      auto* quick = app.add_flag(
          "--quick", o->quick,
          "Run the >= 1 MiB size on i32 (and one reduction) only; every op, dtype, split "
          "and small size still runs");
      app.add_flag("--full", o->full, "Run the >= 1 MiB size on every dtype and reduction")
          ->excludes(quick);
      return [o] { return run_check(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
