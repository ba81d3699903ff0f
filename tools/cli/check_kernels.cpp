// `deepinfer check kernels [--op NAME] [--quick] [--verbose] [--list]`: the op harness, every
// kernel of the cpu backend against its host reference (src/kernels/testing/harness.h).
#include <fmt/format.h>

#include "command.h"
#include "core/check.h"
#include "kernels/testing/harness.h"

namespace {

DEEPINFER_COMMAND("check", "kernels", "Compare every kernel's cpu backend with its host reference",
                  [](CLI::App& app) {
                    auto op = std::make_shared<std::string>();
                    auto quick = std::make_shared<bool>(false);
                    auto verbose = std::make_shared<bool>(false);
                    auto list = std::make_shared<bool>(false);
                    app.add_option("--op", *op, "Only this op (e.g. gemm_fp8)");
                    app.add_flag("--quick", *quick, "Only the quick cases (what ctest runs)");
                    app.add_flag("-v,--verbose", *verbose, "Print every case, not only failures");
                    app.add_flag("--list", *list, "List the cases and exit");
                    return [=]() -> int {
                      using namespace deepinfer::kernels::testing;
                      if (*list) {
                        for (const auto& c : all_op_cases())
                          if (op->empty() || c.op == *op)
                            fmt::print("{} [{}]{}\n", c.op, c.name, c.quick ? " quick" : "");
                        return 0;
                      }
                      const HarnessSummary s =
                          run_harness({.op = *op, .quick = *quick, .verbose = *verbose});
                      return s.failed == 0 ? 0 : 1;
                    };
                  });

}  // namespace
