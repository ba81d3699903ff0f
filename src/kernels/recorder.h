// Call recording for `deepinfer diff` (docs/architecture.md §5): a thread-local layer tag and an
// optional recorder that sees every kernel call (op, tag, call index, shapes, inputs, outputs)
// together with a closure that replays the same call on the `host` backend.
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiler.h"

namespace deepinfer::kernels {

// Names the model part issuing kernel calls on this thread, e.g. KernelTag t("layer3"); then
// KernelTag m("moe") gives "layer3.moe". Tags nest (joined with '.') and are restored on scope
// exit. Under a Profiler (kernels/profiler.h) each scope's wall time is recorded too; `kind`
// marks the scopes where the rank runs collectives (EP dispatch/combine).
class KernelTag {
 public:
  explicit KernelTag(std::string_view name, ScopeKind kind = ScopeKind::compute);
  ~KernelTag();
  KernelTag(const KernelTag&) = delete;
  KernelTag& operator=(const KernelTag&) = delete;

 private:
  size_t saved_size_;
  Profiler* profiler_;
  ScopeKind kind_;
  int64_t start_ns_ = 0;
};

// The current thread's tag ("" outside any KernelTag).
std::string_view current_kernel_tag();

// One buffer of a recorded call: a flat view of `numel` elements.
struct CallBuffer {
  const char* name;  // the params field, e.g. "a", "out"
  DType dtype;
  int64_t numel;
  const void* data;
};

// What a recorder sees for one call. Pointers are valid only during Recorder::on_call.
struct KernelCall {
  std::string_view op;    // e.g. "gemm_fp8"
  std::string_view tag;   // current_kernel_tag() at the call
  uint64_t index;         // per thread and op, counting from 0 (same count DEEPINFER_FAULT uses)
  std::string shape;      // human-readable sizes, e.g. "m=4 n=2048 k=7168"
  KernelBackend backend;  // the backend that ran
  std::span<const CallBuffer>
      inputs;  // copies taken before the call (in-place ops: the old values)
  std::span<const CallBuffer> outputs;  // as produced by `backend`
  // Re-runs this call on `host` from the input copies; returns the host outputs as flat tensors,
  // parallel to `outputs`. Never touches the caller's buffers. May be called at most once.
  std::function<std::vector<Tensor>()> replay_on_host;
};

// Receives every kernel call while installed. on_call runs on the calling thread; a recorder used
// with several rank threads must be thread-safe.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void on_call(const KernelCall& call) = 0;
};

// Installs `r` process-wide for the scope (nullptr = none); restores the previous one on exit.
class ScopedRecorder {
 public:
  explicit ScopedRecorder(Recorder* r);
  ~ScopedRecorder();
  ScopedRecorder(const ScopedRecorder&) = delete;
  ScopedRecorder& operator=(const ScopedRecorder&) = delete;

 private:
  Recorder* saved_;
};

Recorder* active_recorder();

}  // namespace deepinfer::kernels
