// `deepinfer bench kernels [--threads 2] [--quick] [--bench NAME]`: the kernel sub-benches
// (src/kernels/testing/bench.h), JSON lines with ratios to limits measured in the same run.
// Exit code 1 if any correctness check inside a bench failed.
#include <fmt/format.h>

#include "command.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/registry.h"
#include "kernels/testing/bench.h"

namespace {

DEEPINFER_COMMAND("bench", "kernels",
                  "Kernel benchmarks vs memcpy bandwidth, FMA peak and OpenBLAS",
                  [](CLI::App& app) {
                    auto threads = std::make_shared<int>(2);
                    auto quick = std::make_shared<bool>(false);
                    auto only = std::make_shared<std::string>();
                    app.add_option("--threads", *threads,
                                   "Kernel threads (the limits are measured with as many)")
                        ->check(CLI::Range(1, 1024));
                    app.add_flag("--quick", *quick, "Fewer and smaller shapes");
                    app.add_option("--bench", *only, "Only this sub-bench (e.g. gemm_fp8_decode)");
                    return [=]() -> int {
                      using namespace deepinfer;
                      using namespace deepinfer::kernels::testing;
                      ThreadPool pool(*threads);
                      ScopedThreadPool use_pool(pool);
                      BenchContext ctx;
                      ctx.threads = *threads;
                      ctx.quick = *quick;
                      ctx.pool = &pool;
                      int failures = 0;
                      int ran = 0;
                      std::string names;
                      for (const auto& bench : kernel_benches()) {
                        names += (names.empty() ? "" : ", ") + bench.first;
                        if (!only->empty() && bench.first != *only) continue;
                        ++ran;
                        failures += bench.second(ctx);
                      }
                      if (ran == 0) {
                        fmt::print(stderr, "bench kernels: no sub-bench named '{}' (have: {})\n",
                                   *only, names);
                        return 2;
                      }
                      fmt::print(stderr, "bench kernels: {} sub-benches, {} correctness failures\n",
                                 ran, failures);
                      return failures == 0 ? 0 : 1;
                    };
                  });

}  // namespace
