#include "runtime/launch.h"

#include <deepinfer/error.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/registry.h"
#include "model/safetensors.h"
#include "runtime/requests.h"

namespace deepinfer::runtime {
namespace {

// Ranks of this group on this host: an all_gather of a hostname hash.
int ranks_on_this_host(Group& group) {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const uint64_t mine = std::hash<std::string>{}(name);
  std::vector<uint64_t> all(static_cast<size_t>(group.size()));
  group.all_gather(&mine, all.data(), 1, DType::i64);  // 8 bytes each
  return int(std::count(all.begin(), all.end(), mine));
}

}  // namespace

// Every rank gets its own kernel pool, sized to its share of the machine: DEEPINFER_THREADS (or all
// hardware threads) per process, split between the rank threads of a `local` process; under mpi,
// the hardware threads split between the ranks on the host. Pools that each assume the whole
// machine oversubscribe it (docs/performance.md §5).
int kernel_threads_per_rank(Group& group, CommKind comm) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int knob = knobs().threads;
  if (comm == CommKind::local) return std::max(1, (knob > 0 ? knob : hw) / group.size());
  const int here = ranks_on_this_host(group);  // collective: every rank calls it
  return knob > 0 ? knob : std::max(1, hw / here);
}

model::LoadMode load_mode(Group& group, CommKind comm) {
  const std::string& k = knobs().load;
  if (k == "mmap") return model::LoadMode::mmap;
  if (k == "bucket") return model::LoadMode::bucket;
  // auto: one host shares the page cache (mmap reads each byte from disk once per host).
  const bool one_host = comm == CommKind::local || ranks_on_this_host(group) == group.size();
  return one_host ? model::LoadMode::mmap : model::LoadMode::bucket;
}

void run_ranks_with_pools(const LaunchOptions& lo, const std::function<void(Group&)>& fn) {
  run_ranks(lo, [&](Group& group) {
    ThreadPool pool(kernel_threads_per_rank(group, lo.comm));
    ScopedThreadPool use_pool(pool);
    fn(group);
  });
}

void run_model_ranks(const LaunchModelOptions& opts, const std::function<void(RankContext&)>& fn) {
  if (opts.ep < 1) DI_FAIL("{} must be >= 1, got {}", opts.world_option, opts.ep);
  kernels::check_fault_knob();  // a fault naming no kernel op fails before anything loads
  const model::ModelConfig cfg = model::load_config(opts.model_dir);
  auto checkpoint = std::make_shared<const model::Checkpoint>(opts.model_dir);
  // Engram's compression table: built once per process from the tokenizer (docs/engram.md §1.2).
  std::shared_ptr<const CompressionTable> compression;
  if (cfg.engram.enabled()) compression = model::load_compression_table(opts.model_dir);
  LaunchOptions lo;
  lo.comm = opts.comm;
  lo.world = opts.ep;
  lo.world_option = opts.world_option;
  run_ranks_with_pools(lo, [&](Group& group) {
    model::LoadOptions ld;
    ld.ep_rank = group.rank();
    ld.ep_size = group.size();
    ld.gemm = opts.gemm;
    ld.quantize_fp8 = opts.quantize_fp8;
    ld.mtp = opts.mtp;
    ld.fp8_head = opts.fp8_head;
    ld.compression = compression;
    ld.decode_layout = knobs().decode_layout && kernels::backend_from_knobs() == KernelBackend::cpu;
    ld.progress = opts.progress && group.rank() == 0 && isatty(STDERR_FILENO);
    // The routed experts this rank reads (load_weights' split), and the replicated tensors.
    const int64_t local_experts = cfg.n_routed_experts / group.size();
    model::LoadStats stats = model::mmap_load_stats(*checkpoint, group.rank(), group.size(),
                                                    group.rank() * local_experts, local_experts);
    std::shared_ptr<const model::Checkpoint> ck = checkpoint;
    if (load_mode(group, opts.comm) == model::LoadMode::bucket)
      ck = model::gather_replicated(group, checkpoint, knobs().ep_chunk_bytes, stats);
    if (stats.mode == model::LoadMode::bucket)
      log_info("{}", stats.describe());
    else
      log_debug("{}", stats.describe());
    // A rank's load can fail alone (its experts' tensors are its own): the ranks agree on the
    // outcome, so every rank throws the same Error before any runs the model.
    std::shared_ptr<model::ModelWeights> weights;
    std::string problem;
    try {
      weights = model::load_weights(ck, cfg, ld);
    } catch (const Error& e) {
      problem = e.what();
    }
    agree_or_throw(group, problem);
    RankContext ctx{group, std::move(weights), stats};
    fn(ctx);
  });
}

}  // namespace deepinfer::runtime
