// The op-level harness (in the spirit of ggml's test-backend-ops): every op registers cases, each
// case runs the op on `cpu` and on `host` and compares the outputs with a per-case tolerance on
// ‖a−b‖/‖b‖. Outputs are poisoned (NaN for floats, 0xFF bytes otherwise) before every run so an
// element a backend forgets to write fails; NaN never passes. `deepinfer check kernels` and the
// ctest `kernels.harness` both run it.
//
// Registering cases (any .cpp listed in the kernels library, e.g. src/kernels/testing/cases_*.cpp):
//   DEEPINFER_KERNEL_CASES(rms_norm_cases) {           // body receives `std::vector<OpCase>&
//   cases`
//     for (int64_t dim : {1, 7, 7168})
//       cases.push_back({"rms_norm", fmt::format("dim={}", dim), dim < 1000, [=] {
//         RmsNormInputs in(dim);                         // owns the buffers
//         return compare_backends(rms_norm, in.params(), Tolerance{.rel_l2 = 1e-5});
//       }});
//   }
// A case may also check `host` against a closed form: return any CaseResult.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels::testing {

struct CaseResult {
  bool pass = true;
  double max_rel_err = 0;  // worst ‖a−b‖/‖b‖ over the outputs (informational)
  std::string detail;      // why it failed (names the buffer, the first bad index, the values)
};

struct OpCase {
  std::string op;    // the op name (OpSpec::name) the case exercises; --op filters on it
  std::string name;  // shape / variant, e.g. "m=1 n=2048 k=7168"
  bool quick;        // part of the quick set (ctest, `check kernels --quick`)
  std::function<CaseResult()> run;
};

struct Tolerance {
  double rel_l2 = 1e-5;          // per float output: ‖a−b‖₂ / ‖b‖₂ (b = host)
  double int_mismatch_frac = 0;  // per integer output: allowed fraction of differing elements
};

// Compares two flat buffers of `dtype`. b is the reference. Matching infinities are equal and left
// out of the norms; NaN anywhere fails; ‖b‖ = 0 requires a == b.
CaseResult compare_buffers(const char* name, DType dtype, const void* a, const void* b,
                           int64_t numel, const Tolerance& tol);

// Element count for a case's buffer: at least 1, so an empty tensor still has a non-null pointer
// (OpSpec skips null pointers; the harness wants every output listed even when it has 0 elements).
inline size_t buffer_size(int64_t numel) { return size_t(numel > 0 ? numel : 1); }

// Fills a buffer with the poison pattern (NaN for float types, 0xFF bytes otherwise).
void poison(DType dtype, void* data, int64_t numel);

namespace detail {
CaseResult compare_backends_impl(const std::vector<BufferSlot>& slots,
                                 const std::function<void(KernelBackend)>& run,
                                 const Tolerance& tol);
}

// Runs `op(p)` on host, then on cpu (outputs poisoned before each run, in-place buffers restored),
// and compares every output. `p` must point at live buffers owned by the caller.
template <class P>
CaseResult compare_backends(void (*op)(const P&), const P& p, const Tolerance& tol) {
  return detail::compare_backends_impl(
      collect_buffers(p),
      [&](KernelBackend b) {
        ScopedBackend use(b);
        op(p);
      },
      tol);
}

// Case registration (static initialisation; the kernels CMakeLists links case objects whole).
bool register_op_cases(const char* source, void (*fn)(std::vector<OpCase>&));
std::vector<OpCase> all_op_cases();

#define DEEPINFER_KERNEL_CASES(fn)                                           \
  static void fn(std::vector<::deepinfer::kernels::testing::OpCase>& cases); \
  static const bool DEEPINFER_KERNEL_CASES_##fn =                            \
      ::deepinfer::kernels::testing::register_op_cases(#fn, &fn);            \
  static void fn(std::vector<::deepinfer::kernels::testing::OpCase>& cases)

struct HarnessOptions {
  std::string op;        // run only cases of this op ("" = all)
  bool quick = false;    // only quick cases
  bool verbose = false;  // one line per case, not only failures
  std::FILE* out = stdout;
};

struct HarnessSummary {
  int passed = 0;
  int failed = 0;
  std::vector<std::string> ops;  // ops that had at least one case run
};

// Runs the selected cases; prints failures (every case with verbose) and the last line
// "kernels: N passed, M failed". An exception in a case counts as a failure.
HarnessSummary run_harness(const HarnessOptions& opt);

}  // namespace deepinfer::kernels::testing
