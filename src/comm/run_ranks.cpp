// run_ranks: builds each rank's Group (backend, optional fault wrapper, optional capabilities
// override) and runs the user's function on it. `local`: one thread per rank; the most telling
// error is rethrown after every thread has returned. `mpi`: this process is one rank; an error
// is printed with the rank and the job is aborted so no peer is left waiting (and where the abort
// cannot reach mpirun, the process ends itself after a grace period).
#include <deepinfer/comm.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "comm/capabilities.h"
#include "comm/common.h"
#include "comm/faulty/faulty_group.h"
#include "comm/local/local_group.h"
#include "comm/mpi/mpi_group.h"
#include "comm/platform.h"
#include "core/check.h"
#include "core/env.h"
#include "core/log.h"

namespace deepinfer {
namespace {

std::optional<CapabilitiesFile> capabilities_override() {
  const std::string& path = knobs().capabilities_file;
  if (path.empty()) return std::nullopt;
  return load_capabilities(path);
}

std::unique_ptr<Group> wrap(std::unique_ptr<Group> g, const LaunchOptions& opts, double timeout_s,
                            const std::optional<CapabilitiesFile>& caps) {
  if (!opts.fault.empty()) g = comm::make_faulty_group(std::move(g), opts.fault, timeout_s);
  if (caps) g = with_capabilities_override(std::move(g), *caps);
  return g;
}

// How a rank thread ended. Lower kind = more telling: a real error explains the failure, a
// CommTimeout is usually its consequence, a silent death (rank-exit) is what peers time out on.
enum class Ending : uint8_t { error, timeout, died, ok };

struct Outcome {
  Ending ending = Ending::ok;
  uint64_t order = 0;  // when it ended, relative to the other ranks
  std::exception_ptr error;
};

void run_local(const LaunchOptions& opts, const std::function<void(Group&)>& fn) {
  const int n = opts.world;
  if (n < 1 || n > comm::kMaxLocalWorld)
    DI_FAIL("{} must be in [1, {}] for the local backend, got {}", opts.world_option,
            comm::kMaxLocalWorld, n);
  const double timeout_s = comm::resolve_timeout(opts.timeout_s);
  const auto caps = capabilities_override();
  if (!opts.fault.empty()) comm::check_fault_name(opts.fault);
  auto world = std::make_shared<comm::LocalWorld>(n, timeout_s);

  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::atomic<uint64_t> clock{0};
  const bool pin = knobs().pin_ranks && n > 1;
  auto body = [&](int r) {
    set_log_rank(r, n);
    set_thread_placement(Placement{r, n, r, "local"});
    if (pin) pin_rank_thread(r, n);
    Outcome& out = outcomes[size_t(r)];
    try {
      auto g = wrap(std::make_unique<comm::LocalGroup>(world, r), opts, timeout_s, caps);
      fn(*g);
      world->mark_exited(r);
    } catch (const comm::RankDied&) {
      out = {Ending::died, clock++, std::current_exception()};  // peers are not told
    } catch (const CommTimeout& e) {
      out = {Ending::timeout, clock++, std::current_exception()};
      world->mark_broken(fmt::format("rank {}: {}", r, e.what()));
    } catch (const std::exception& e) {
      out = {Ending::error, clock++, std::current_exception()};
      world->mark_broken(fmt::format("rank {} failed: {}", r, e.what()));
    } catch (...) {
      out = {Ending::error, clock++, std::current_exception()};
      world->mark_broken(fmt::format("rank {} failed with a non-standard exception", r));
    }
    world->mark_left(r);  // a peer holding memory it lent this rank need not wait for it
    set_thread_placement(std::nullopt);
    set_log_rank(-1, 0);
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();

  const Outcome* pick = nullptr;
  for (const Outcome& o : outcomes)
    if (o.ending != Ending::ok &&
        (!pick || o.ending < pick->ending || (o.ending == pick->ending && o.order < pick->order)))
      pick = &o;
  if (pick) std::rethrow_exception(pick->error);
}

// MPI_Abort asks the launcher to end every rank of the job, this one included, and returns only
// when it could not. Where the launcher is out of reach (a network partition between this host and
// mpirun), nothing may ever end this process: a watchdog armed first ends it with exit status 1
// after kMpiAbortGraceSeconds, so a rank never outlives its deadline by more than that.
[[noreturn]] void abort_mpi_job(int rank, int size, const std::string& why) {
  log_error("{}", why);
  std::fflush(nullptr);
  std::thread([rank, size] {
    set_log_rank(rank, size);
    std::this_thread::sleep_for(std::chrono::duration<double>(comm::kMpiAbortGraceSeconds));
    log_error(
        "MPI_Abort has not ended this process after {} s (mpirun is unreachable from this "
        "host?): exiting with status 1",
        comm::kMpiAbortGraceSeconds);
    std::fflush(nullptr);
    ::_exit(1);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  ::_exit(1);
}

void run_mpi(const LaunchOptions& opts, const std::function<void(Group&)>& fn) {
  if (!opts.fault.empty()) comm::check_fault_name(opts.fault);
  comm::mpi_init_once();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (opts.world > 1 && opts.world != size && size == 1 && !launcher_placement())
    DI_FAIL(
        "{0} {1} with --comm mpi needs {1} processes, one per rank, but this one was not started "
        "by "
        "mpirun: launch it as `mpirun -np {1} deepinfer ...`, or use --comm local to run {1} rank "
        "threads in this process",
        opts.world_option, opts.world);
  if (opts.world > 1 && opts.world != size)
    DI_FAIL(
        "{0} {1} but mpirun started {2} processes: use `mpirun -np {1}`, or drop {0} (the launch "
        "sets it)",
        opts.world_option, opts.world, size);
  set_log_rank(rank, size);
  if (auto p = launcher_placement(); p && (p->rank != rank || p->world != size))
    log_warn("launcher environment says rank {} of {} ({}), MPI says rank {} of {}; using MPI's",
             p->rank, p->world, p->source, rank, size);
  const double timeout_s = comm::resolve_timeout(opts.timeout_s);
  auto mpi = std::make_unique<comm::MpiGroup>(timeout_s);
  comm::MpiGroup* raw = mpi.get();
  std::unique_ptr<Group> g;
  try {
    g = wrap(std::move(mpi), opts, timeout_s, capabilities_override());
    fn(*g);
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    abort_mpi_job(rank, size, "aborting the MPI job so no rank is left waiting");
  }
  if (raw->broken()) {
    // A collective timed out and its requests are still pending: finalising would hang.
    abort_mpi_job(rank, size,
                  "a collective on this rank failed earlier; aborting the MPI job so no rank is "
                  "left waiting");
  }
}

}  // namespace

std::string_view to_string(CommKind v) { return v == CommKind::local ? "local" : "mpi"; }

CommKind comm_kind_from_knobs() {
  const std::string& w = knobs().comm;
  for (CommKind k : {CommKind::local, CommKind::mpi})
    if (to_string(k) == w) return k;
  DI_FAIL(
      "DEEPINFER_COMM='{}' names no backend (internal: the knob's allowed words and comm disagree)",
      w);
}

void run_ranks(const LaunchOptions& opts, const std::function<void(Group&)>& fn) {
  switch (opts.comm) {
    case CommKind::local:
      return run_local(opts, fn);
    case CommKind::mpi:
      return run_mpi(opts, fn);
  }
  DI_FAIL("unknown comm backend {}", int(opts.comm));
}

}  // namespace deepinfer
