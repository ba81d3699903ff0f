#include "comm/platform.h"

#include <deepinfer/error.h>

#include <charconv>
#include <cstdlib>

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

std::optional<Placement> launcher_placement() {
  return launcher_placement([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

Placement current_placement() {
  if (t_placement) return *t_placement;
  if (auto p = launcher_placement()) return *p;
  return Placement{};
}

void set_thread_placement(const std::optional<Placement>& p) { t_placement = p; }

}  // namespace deepinfer
