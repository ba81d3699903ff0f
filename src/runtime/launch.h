// Per-process launcher shared by the CLI commands: loads config.json and mmaps the checkpoint
// once per process, then runs fn on every rank (threads for `local`, this process for `mpi`)
// with that rank's weights (replicated tensors point into the shared mmap; only the rank's own
// experts and converted tensors are per rank). With DEEPINFER_LOAD=bucket each rank reads 1/W of
// the replicated tensors and an all_gather assembles a private copy (docs/ep.md §13.4).
#pragma once

#include <deepinfer/comm.h>

#include <functional>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/distributed_load.h"
#include "model/weights.h"

namespace deepinfer::runtime {

struct LaunchModelOptions {
  std::string model_dir;
  int ep = 1;
  CommKind comm = CommKind::local;
  model::GemmMode gemm = model::GemmMode::fp8;
  bool quantize_fp8 = false;
  bool progress = false;  // rank 0 progress bar while weights load (on a terminal)
  bool mtp = false;       // also load the MTP module (speculative decoding; LoadOptions::mtp)
  bool fp8_head = false;  // LoadOptions::fp8_head
  std::string world_option = "--ep";  // how the user sets `ep`, for messages
};

struct RankContext {
  Group& group;
  std::shared_ptr<const model::ModelWeights> weights;
  model::LoadStats load;  // what this rank read from the checkpoint (DEEPINFER_LOAD)
};

// DEEPINFER_LOAD for this group: mmap or bucket; auto takes bucket where the ranks span several
// hosts (collective under mpi: every rank gets the same answer).
model::LoadMode load_mode(Group& group, CommKind comm);

// Runs fn on every rank with that rank's kernel pool installed (kernel_threads_per_rank).
void run_model_ranks(const LaunchModelOptions& opts, const std::function<void(RankContext&)>& fn);

// Kernel threads for one rank (collective under mpi).
int kernel_threads_per_rank(Group& group, CommKind comm);

// run_ranks with each rank's own pool installed (ScopedThreadPool, kernel_threads_per_rank
// threads), which its kernels and EPBuffer's combine split their work over.
void run_ranks_with_pools(const LaunchOptions& lo, const std::function<void(Group&)>& fn);

}  // namespace deepinfer::runtime
