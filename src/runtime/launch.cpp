#include "runtime/launch.h"

#include <deepinfer/error.h>

#include <unistd.h>

#include "model/safetensors.h"

namespace deepinfer::runtime {

void run_model_ranks(const LaunchModelOptions& opts, const std::function<void(RankContext&)>& fn) {
  DI_CHECK(opts.ep >= 1, "--ep must be >= 1, got {}", opts.ep);
  const model::ModelConfig cfg = model::load_config(opts.model_dir);
  auto checkpoint = std::make_shared<const model::Checkpoint>(opts.model_dir);
  LaunchOptions lo;
  lo.comm = opts.comm;
  lo.world = opts.ep;
  run_ranks(lo, [&](Group& group) {
    model::LoadOptions ld;
    ld.ep_rank = group.rank();
    ld.ep_size = group.size();
    ld.gemm = opts.gemm;
    ld.quantize_fp8 = opts.quantize_fp8;
    ld.progress = opts.progress && group.rank() == 0 && isatty(STDERR_FILENO);
    RankContext ctx{group, model::load_weights(checkpoint, cfg, ld)};
    fn(ctx);
  });
}

}  // namespace deepinfer::runtime
