// Where this rank sits: rank, world size and local rank (index on its node), read from the
// launcher's environment (OpenMPI, PMI, Slurm) or, for the `local` backend, the rank thread.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace deepinfer {

struct Placement {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string source = "default";  // "openmpi", "pmi", "slurm", "local", "default"
};

// The launcher's view from environment variables, checked in this order:
// OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, PMI_RANK/PMI_SIZE (+ MPI_LOCALRANKID),
// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID. nullopt when no launcher is visible. A malformed
// value is an Error naming the variable.
std::optional<Placement> launcher_placement(
    const std::function<std::optional<std::string>(const char*)>& getenv);
std::optional<Placement> launcher_placement();  // from the real environment

// This thread's placement: the `local` rank thread's if inside run_ranks(local), else the
// launcher's, else rank 0 of 1.
Placement current_placement();

// Set by run_ranks for each `local` rank thread (and cleared when it returns).
void set_thread_placement(const std::optional<Placement>& p);

// Rank `rank`'s share of `cpus` when `world` ranks split them: contiguous runs of the listed
// order, the first cpus.size() % world ranks one CPU more. Empty when there are fewer CPUs than
// ranks (then nobody is pinned).
std::vector<int> cpu_share(std::span<const int> cpus, int rank, int world);

// Pins the calling `local` rank thread to its cpu_share of the CPUs this process may use (threads
// it starts later, e.g. its kernel pool, inherit the share). Without pinning, the scheduler at
// times runs two rank threads on one CPU while another idles, and every collective then waits on
// the rank that is not running (local W=2 bench ep: dispatch 0.53-0.57 ms in those processes,
// 0.23-0.29 otherwise). Returns false, changing nothing, when the share is empty.
bool pin_rank_thread(int rank, int world);

}  // namespace deepinfer
