// Kernel backend registry (docs/architecture.md §5). Every op is one params struct + one function
//   void op(const OpParams&)            in deepinfer::kernels        (dispatches)
//   void host::op(const OpParams&)      the reference: scalar, fp32/fp64 sums, docs/numerics.md
//   void cpu::op(const OpParams&)       the fast one: Highway SIMD + kernel_pool()
// plus an OpSpec<OpParams> specialisation (next to the params struct) that names the op and lists
// its pointer fields, so the dispatcher can record calls, replay them on host, and inject faults,
// and the test harness can poison outputs; nothing else is written per op:
//
//   template <> struct OpSpec<RmsNormParams> {
//     static constexpr const char* name = "rms_norm";
//     static std::string shape(const RmsNormParams& p) { return fmt::format("rows={} dim={}",
//     p.rows, p.dim); } template <class V> static void visit(RmsNormParams& p, V& v) {
//       v.in("x", p.x, p.rows * p.dim);        // element counts, not bytes; the type gives the
//       dtype v.in("w", p.w, p.dim); v.out("out", p.out, p.rows * p.dim);   // v.inout(...) for
//       buffers read and written in place
//     }
//   };
//   void rms_norm(const RmsNormParams& p) { dispatch(p, host::rms_norm, cpu::rms_norm); }
//
// The specialisation lives in namespace deepinfer::kernels (where OpSpec is declared), next to the
// params struct. Null pointers are skipped (optional buffers). Output order matters: the first
// output is the one DEEPINFER_FAULT perturbs. Host functions call host:: functions directly, never
// the dispatcher.
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/error.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/env.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/recorder.h"

namespace deepinfer::kernels {

// ---- backend selection -------------------------------------------------------------------------

// The DEEPINFER_KERNELS knob (read once per process).
KernelBackend backend_from_knobs();
// The backend ops on this thread use: the innermost ScopedBackend, else backend_from_knobs().
KernelBackend current_backend();

// Overrides the backend on this thread for the scope (the diff tool and tests use it).
class ScopedBackend {
 public:
  explicit ScopedBackend(KernelBackend b);
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  int saved_;  // -1 = no override
};

// The pool cpu kernels run on: scoped_pool() (the innermost ScopedThreadPool on this thread),
// else global_pool().
ThreadPool& kernel_pool();

// ---- per-op description
// --------------------------------------------------------------------------

template <class P>
struct OpSpec;  // specialised per op, see the top of this file

template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<U, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<U, bf16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<U, fp8_e4m3>)
    return DType::e4m3;
  else if constexpr (std::is_same_v<U, fp8_e5m2>)
    return DType::e5m2;
  else if constexpr (std::is_same_v<U, int8_t>)
    return DType::i8;
  else if constexpr (std::is_same_v<U, uint8_t>)
    return DType::u8;
  else if constexpr (std::is_same_v<U, int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<U, int64_t>)
    return DType::i64;
  else
    static_assert(sizeof(U) == 0, "kernel buffer element type has no DType");
}

enum class BufferRole : uint8_t { in, out, inout };

// One pointer field of a params struct, as listed by OpSpec::visit.
struct BufferSlot {
  const char* name;
  DType dtype;
  int64_t numel;
  void* ptr;
  BufferRole role;
};

namespace detail {
struct CollectVisitor {
  std::vector<BufferSlot> slots;
  template <class T>
  void in(const char* name, T*& p, int64_t numel) {
    add(name, p, numel, BufferRole::in);
  }
  template <class T>
  void out(const char* name, T*& p, int64_t numel) {
    add(name, p, numel, BufferRole::out);
  }
  template <class T>
  void inout(const char* name, T*& p, int64_t numel) {
    add(name, p, numel, BufferRole::inout);
  }
  template <class T>
  void add(const char* name, T* p, int64_t numel, BufferRole role) {
    if (p == nullptr) return;
    DI_CHECK(numel >= 0, "kernel buffer '{}' has negative size {}", name, numel);
    slots.push_back(
        {name, dtype_of<T>(), numel, const_cast<void*>(static_cast<const void*>(p)), role});
  }
};
struct RedirectVisitor {
  const std::vector<void*>& ptrs;
  size_t i = 0;
  template <class T>
  void in(const char*, T*& p, int64_t) {
    set(p);
  }
  template <class T>
  void out(const char*, T*& p, int64_t) {
    set(p);
  }
  template <class T>
  void inout(const char*, T*& p, int64_t) {
    set(p);
  }
  template <class T>
  void set(T*& p) {
    if (p == nullptr) return;
    p = static_cast<T*>(ptrs.at(i++));
  }
};
}  // namespace detail

// The non-null pointer fields of `p`, in OpSpec::visit order.
template <class P>
std::vector<BufferSlot> collect_buffers(const P& p) {
  P copy = p;
  detail::CollectVisitor v;
  OpSpec<P>::visit(copy, v);
  return std::move(v.slots);
}

// A copy of `p` whose non-null pointer fields point at ptrs[i] (same order as collect_buffers).
template <class P>
P redirect_buffers(const P& p, const std::vector<void*>& ptrs) {
  P copy = p;
  detail::RedirectVisitor v{ptrs};
  OpSpec<P>::visit(copy, v);
  DI_CHECK(v.i == ptrs.size(), "redirect_buffers: {} pointers given, {} fields", ptrs.size(), v.i);
  return copy;
}

// ---- call counting and fault injection
// -----------------------------------------------------------

// Index of this call among calls of `op` on this thread (0, 1, 2, ...).
uint64_t next_call_index(const char* op);
// Restarts every op's count on this thread (a new forward pass, a new test).
void reset_call_counters();

// The name of every kernel op (OpSpec<P>::name), in no particular order.
std::span<const std::string_view> op_names();
// Throws Error naming DEEPINFER_FAULT, its value and the known op names when the fault names an
// op that is not a kernel op (core checks the form). Called at startup, where kernels are set up.
void check_fault_knob();

// True when DEEPINFER_FAULT=kernel:<op>:<call> names this op and call index. The fault applies to
// the `cpu` backend only (the reference stays clean so the diff tool can find it). Other fault
// kinds (not starting with "kernel:") are ignored here.
bool fault_matches(const char* op, uint64_t index);

// Perturbs a buffer so it is clearly wrong but finite: floats x -> 1.5x + 1, integers: element 0
// gets its lowest bit flipped.
void perturb_buffer(const BufferSlot& slot);

namespace detail {
void profile_call(Profiler& prof, const char* op, const std::function<void()>& run,
                  const KernelWork& work = {});
void record_call(Recorder& rec, const char* op, uint64_t index, std::string shape,
                 KernelBackend backend, const std::vector<BufferSlot>& slots,
                 const std::function<void()>& run,
                 std::function<void(const std::vector<void*>&)> run_host_at);
void apply_fault(const std::vector<BufferSlot>& slots);
}  // namespace detail

// ---- the dispatcher
// --------------------------------------------------------------------------------

template <class P>
void dispatch(const P& p, void (*host_fn)(const P&), void (*cpu_fn)(const P&)) {
  using Spec = OpSpec<P>;
  const KernelBackend backend = current_backend();
  const uint64_t index = next_call_index(Spec::name);
  void (*fn)(const P&) = backend == KernelBackend::host ? host_fn : cpu_fn;
  const bool fault = backend == KernelBackend::cpu && fault_matches(Spec::name, index);
  Recorder* rec = active_recorder();
  if (rec == nullptr) [[likely]] {
    if (Profiler* prof = active_profiler(); prof != nullptr) [[unlikely]] {
      KernelWork work;  // ops whose OpSpec says what they stream and compute (GEMMs)
      if constexpr (requires { Spec::work(p); }) work = Spec::work(p);
      detail::profile_call(
          *prof, Spec::name, [&] { fn(p); }, work);
    } else
      fn(p);
    if (fault) detail::apply_fault(collect_buffers(p));
    return;
  }
  detail::record_call(
      *rec, Spec::name, index, Spec::shape(p), backend, collect_buffers(p),
      [&] {
        fn(p);
        if (fault) detail::apply_fault(collect_buffers(p));
      },
      [p, host_fn](const std::vector<void*>& ptrs) { host_fn(redirect_buffers(p, ptrs)); });
}

}  // namespace deepinfer::kernels
