// `deepinfer check engram` and `deepinfer check bucket`: the EngramBuffer matrix
// (src/ep/engram/check_engram.h) and the BucketBuffer matrix (src/ep/bucket/check_bucket.h), the
// EP family beside `check ep`, on `local` (--world threads) or under mpirun (--comm mpi),
// optionally through a faulty backend. Last line `engram: N passed, M failed` (`bucket: ...`);
// exit code 1 on any failure.
#include "ep/engram/check_engram.h"

#include <deepinfer/comm.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "ep/bucket/check_bucket.h"
#include "runtime/launch.h"

namespace deepinfer::cli {
namespace {

struct CheckFamilyCli {
  std::string comm;
  int world = 0;
  std::string fault;
  double timeout_s = 0;
  uint64_t seed = 1;
  bool verbose = false;

  LaunchOptions launch() const {
    LaunchOptions lo;
    lo.comm = resolve_comm(comm);
    lo.world = world > 0 ? world : (lo.comm == CommKind::local ? 4 : 0);
    lo.fault = fault;
    lo.timeout_s = timeout_s;
    return lo;
  }
};

int run_check_engram_cli(const CheckFamilyCli& o) {
  ep::engram::CheckEngramOptions co;
  co.seed = o.seed;
  co.verbose = o.verbose;
  return run_check_suite<ep::engram::CheckEngramResult>(
      o.launch(), "engram", [&](Group& g) { return ep::engram::run_check_engram(g, co); });
}

int run_check_bucket_cli(const CheckFamilyCli& o) {
  ep::bucket::CheckBucketOptions co;
  co.seed = o.seed;
  co.verbose = o.verbose;
  return run_check_suite<ep::bucket::CheckBucketResult>(
      o.launch(), "bucket", [&](Group& g) { return ep::bucket::run_check_bucket(g, co); });
}

// The options both commands take; `what` is the wrapped backend's duty under --fault.
std::shared_ptr<CheckFamilyCli> add_family_options(CLI::App& app, const char* fault_help,
                                                   const char* seed_help) {
  auto o = std::make_shared<CheckFamilyCli>();
  app.add_option("--comm", o->comm,
                 "Backend: local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
      ->check(CLI::IsMember({"local", "mpi"}));
  app.add_option("--world", o->world,
                 "Ranks: local threads (default 4); mpi checks it against mpirun -np")
      ->check(CLI::Range(1, 1024));
  std::vector<std::string> faults;
  for (const auto& f : fault_names()) faults.emplace_back(f.first);
  app.add_option("--fault", o->fault, fault_help)->check(CLI::IsMember(faults));
  app.add_option("--timeout", o->timeout_s,
                 "Deadline of each collective in seconds (default DEEPINFER_COMM_TIMEOUT_S)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o->seed, seed_help);
  app.add_flag("--verbose", o->verbose, "One line per case");
  return o;
}

DEEPINFER_COMMAND(
    "check", "engram",
    "EngramBuffer matrix: every fetch lowering x bf16/fp8 + scale factors x index patterns "
    "(duplicates, -1, one owner, T = 0, J = 32, n prime) bit-exact against a host reference, and "
    "agreed errors; last line `engram: N passed, M failed`",
    [](CLI::App& app) {
      auto o = add_family_options(
          app,
          "Run through a faulty backend (it reports no peer memory, and no trusted all_to_all_v "
          "where it breaks it): the lowerings left must still pass",
          "Seed of the generated tables and indices (default 1)");
      return [o] { return run_check_engram_cli(*o); };
    });

DEEPINFER_COMMAND(
    "check", "bucket",
    "BucketBuffer matrix: all_gather of random lists (mixed sizes and dtypes) bit-exact against "
    "a plain all_gather, reduce_scatter (every lowering x fp32/bf16 transport x scales) bit-exact "
    "against a host reduce_scatter in the same order, and agreed errors; last line `bucket: N "
    "passed, M failed`",
    [](CLI::App& app) {
      auto o = add_family_options(
          app,
          "Run through a faulty backend (no trusted all_to_all where it breaks it): the "
          "lowerings left must still pass",
          "Seed of the generated shards and values (default 1)");
      return [o] { return run_check_bucket_cli(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
