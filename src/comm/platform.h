// Where this rank sits: rank, world size and local rank (index on its node), read from the
// launcher's environment (OpenMPI, PMI, Slurm) or, for the `local` backend, the rank thread.
#pragma once

#include <deepinfer/comm.h>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

// A launch of several processes (mpirun, mpiexec, srun): the size the launcher gave and the
// variable that says so. Checked in this order: OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH,
// Intel MPI), PMIX_SIZE, SLURM_STEP_NUM_TASKS (srun; SLURM_NTASKS alone is also set inside an
// sbatch script that starts one process). nullopt when no launcher says so; a malformed value is
// an Error naming the variable.
struct MultiProcessLaunch {
  int processes = 1;
  std::string variable;  // e.g. "OMPI_COMM_WORLD_SIZE"
};
std::optional<MultiProcessLaunch> multi_process_launch(
    const std::function<std::optional<std::string>(const char*)>& getenv);
std::optional<MultiProcessLaunch> multi_process_launch();  // from the real environment

// How long the launcher waits between the SIGTERM and the SIGKILL with which it ends every rank of
// a job (a rank or its host failed, or the launcher itself was signalled): Open MPI's
// odls_base_sigkill_timeout, which mpirun passes to the ranks as
// OMPI_MCA_odls_base_sigkill_timeout (Open MPI's default, 1 s, when unset). nullopt when the
// launcher is not Open MPI. A malformed value is an Error naming the variable.
std::optional<double> launcher_kill_grace_s(
    const std::function<std::optional<std::string>(const char*)>& getenv);
std::optional<double> launcher_kill_grace_s();  // from the real environment

// The backend a command runs on. `option` is what the user typed (e.g. --comm, nullopt if not),
// `env_comm` what DEEPINFER_COMM says (nullopt if unset), `fallback` the default. Under a launch
// of more than one process, the answer is mpi: each process running its own `local` job would
// print everything N times, so an explicit local there is an Error naming who asked for it.
CommKind choose_comm(std::optional<CommKind> option, std::string_view option_name,
                     std::optional<CommKind> env_comm, CommKind fallback,
                     const std::optional<MultiProcessLaunch>& launch);

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
// the rank that is not running (docs/performance.md §4). Returns false, changing nothing, when
// the share is empty.
bool pin_rank_thread(int rank, int world);

}  // namespace deepinfer
