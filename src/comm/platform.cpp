#include "comm/platform.h"

#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "core/check.h"

namespace deepinfer {
namespace {

thread_local std::optional<Placement> t_placement;

int parse_int_var(const char* name, const std::string& v) {
  int out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out < 0)
    DI_FAIL(
        "{}='{}' is not a non-negative integer; it is set by the job launcher (mpirun/srun) — "
        "unset it or run under the launcher",
        name, v);
  return out;
}

struct Scheme {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
};
constexpr Scheme kSchemes[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

std::optional<std::string> real_getenv(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// Open MPI's default odls_base_sigkill_timeout: seconds between its SIGTERM and SIGKILL.
constexpr double kOpenMpiSigkillTimeoutSeconds = 1.0;

}  // namespace

std::optional<Placement> launcher_placement(
    const std::function<std::optional<std::string>(const char*)>& getenv) {
  for (const Scheme& s : kSchemes) {
    auto rank = getenv(s.rank);
    auto size = getenv(s.size);
    if (!rank || !size) continue;
    Placement p;
    p.source = s.source;
    p.rank = parse_int_var(s.rank, *rank);
    p.world = parse_int_var(s.size, *size);
    if (auto lr = getenv(s.local_rank)) p.local_rank = parse_int_var(s.local_rank, *lr);
    if (p.world < 1 || p.rank >= p.world)
      DI_FAIL("{}={} and {}={} are inconsistent (need 0 <= rank < size)", s.rank, *rank, s.size,
              *size);
    return p;
  }
  return std::nullopt;
}

std::optional<Placement> launcher_placement() { return launcher_placement(real_getenv); }

std::optional<MultiProcessLaunch> multi_process_launch(
    const std::function<std::optional<std::string>(const char*)>& getenv) {
  for (const char* var :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    if (auto v = getenv(var)) return MultiProcessLaunch{parse_int_var(var, *v), var};
  }
  return std::nullopt;
}

std::optional<MultiProcessLaunch> multi_process_launch() {
  return multi_process_launch(real_getenv);
}

std::optional<double> launcher_kill_grace_s(
    const std::function<std::optional<std::string>(const char*)>& getenv) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  constexpr const char* kVar = "OMPI_MCA_odls_base_sigkill_timeout";
  if (auto v = getenv(kVar)) return double(parse_int_var(kVar, *v));
  return kOpenMpiSigkillTimeoutSeconds;
}

std::optional<double> launcher_kill_grace_s() { return launcher_kill_grace_s(real_getenv); }

CommKind choose_comm(std::optional<CommKind> option, std::string_view option_name,
                     std::optional<CommKind> env_comm, CommKind fallback,
                     const std::optional<MultiProcessLaunch>& launch) {
  if (!launch || launch->processes <= 1) return option ? *option : env_comm ? *env_comm : fallback;
  const std::string who = option ? fmt::format("{} local", option_name) : "DEEPINFER_COMM=local";
  if ((option && *option == CommKind::local) ||
      (!option && env_comm && *env_comm == CommKind::local))
    DI_FAIL(
        "{}, but this process is one of {} started by a launcher ({}={}): each would run its own "
        "independent local job. Drop {} (under mpirun/srun the ranks are the processes: --comm "
        "mpi), "
        "or run without the launcher to use rank threads",
        who, launch->processes, launch->variable, launch->processes, who);
  return CommKind::mpi;
}

Placement current_placement() {
  if (t_placement) return *t_placement;
  if (auto p = launcher_placement()) return *p;
  return Placement{};
}

void set_thread_placement(const std::optional<Placement>& p) { t_placement = p; }

std::vector<int> cpu_share(std::span<const int> cpus, int rank, int world) {
  const size_t n = cpus.size(), w = size_t(world);
  if (world < 1 || rank < 0 || rank >= world || n < w) return {};
  const size_t r = size_t(rank), base = n / w, extra = n % w;
  const size_t begin = r * base + std::min(r, extra);
  return {cpus.begin() + std::ptrdiff_t(begin),
          cpus.begin() + std::ptrdiff_t(begin + base + (r < extra))};
}

bool pin_rank_thread(int rank, int world) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const std::vector<int> share = cpu_share(cpus, rank, world);
  if (share.empty()) return false;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  for (int c : share) CPU_SET(c, &mine);
  return pthread_setaffinity_np(pthread_self(), sizeof(mine), &mine) == 0;
}

}  // namespace deepinfer
