#include "kernels/recorder.h"

#include <atomic>
#include <chrono>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

namespace {
thread_local std::string t_tag;
std::atomic<Recorder*> g_recorder{nullptr};
}  // namespace

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

KernelTag::KernelTag(std::string_view name, ScopeKind kind)
    : saved_size_(t_tag.size()), profiler_(active_profiler()), kind_(kind) {
  if (!t_tag.empty()) t_tag += '.';
  t_tag += name;
  if (profiler_ != nullptr) start_ns_ = now_ns();
}
KernelTag::~KernelTag() {
  if (profiler_ != nullptr) profiler_->on_scope(t_tag, kind_, double(now_ns() - start_ns_) * 1e-9);
  t_tag.resize(saved_size_);
}

std::string_view current_kernel_tag() { return t_tag; }

ScopedRecorder::ScopedRecorder(Recorder* r) : saved_(g_recorder.exchange(r)) {}
ScopedRecorder::~ScopedRecorder() { g_recorder.store(saved_); }

Recorder* active_recorder() { return g_recorder.load(std::memory_order_acquire); }

namespace detail {

void profile_call(Profiler& prof, const char* op, const std::function<void()>& run,
                  const KernelWork& work) {
  const int64_t wait0 = pool_wait_ns(), t0 = now_ns();
  run();
  const int64_t t1 = now_ns(), wait1 = pool_wait_ns();
  prof.on_kernel(op, t_tag, double(t1 - t0) * 1e-9, double(wait1 - wait0) * 1e-9, work);
}

void record_call(Recorder& rec, const char* op, uint64_t index, std::string shape,
                 KernelBackend backend, const std::vector<BufferSlot>& slots,
                 const std::function<void()>& run,
                 std::function<void(const std::vector<void*>&)> run_host_at) {
  // Copies of everything the op reads, taken before it runs (in-place buffers change).
  auto snapshots = std::make_shared<std::vector<Tensor>>();
  std::vector<CallBuffer> inputs, outputs;
  // Pure outputs are copied too: strided outputs (e.g. rms_norm with out_stride) leave gaps the op
  // never writes, and the host replay must start from the same gap contents to compare equal.
  for (const auto& s : slots) {
    Tensor t = Tensor::empty(s.dtype, {s.numel});
    if (s.numel) std::memcpy(t.raw(), s.ptr, size_t(s.numel) * dtype_size(s.dtype));
    if (s.role != BufferRole::out) inputs.push_back({s.name, s.dtype, s.numel, t.raw()});
    snapshots->push_back(std::move(t));
  }
  run();
  for (const auto& s : slots)
    if (s.role != BufferRole::in) outputs.push_back({s.name, s.dtype, s.numel, s.ptr});

  KernelCall call{op, current_kernel_tag(), index, std::move(shape), backend, inputs, outputs, {}};
  call.replay_on_host = [snapshots, slots, run_host_at = std::move(run_host_at)]() {
    std::vector<void*> ptrs;
    std::vector<Tensor> results;
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto& s = slots[i];
      if (s.role == BufferRole::in) {
        ptrs.push_back((*snapshots)[i].raw());
      } else {
        // out and inout: a copy of the pre-call contents, so the snapshot stays intact and any
        // element the op does not write matches the backend's buffer.
        Tensor t = (*snapshots)[i].clone();
        ptrs.push_back(t.raw());
        results.push_back(std::move(t));
      }
    }
    ScopedBackend use(KernelBackend::host);
    run_host_at(ptrs);
    return results;
  };
  rec.on_call(call);
}

}  // namespace detail
}  // namespace deepinfer::kernels
