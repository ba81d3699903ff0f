#include "kernels/registry.h"

#include <cstring>
#include <string_view>

namespace deepinfer::kernels {

namespace {
thread_local int t_backend_override = -1;

struct CallCounter {
  const char* op;  // OpSpec::name: static storage, compared by pointer first
  uint64_t count;
};
thread_local std::vector<CallCounter> t_counters;

struct FaultSpec {
  std::string source;  // the knob value it was parsed from
  bool armed = false;
  std::string op;
  uint64_t call = 0;
};

FaultSpec parse_fault(const std::string& s) {
  FaultSpec f;
  f.source = s;
  constexpr std::string_view prefix = "kernel:";
  if (s.compare(0, prefix.size(), prefix) != 0) return f;  // another layer's fault kind
  const std::string rest = s.substr(prefix.size());
  const size_t colon = rest.rfind(':');
  DI_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < rest.size(),
           "DEEPINFER_FAULT='{}' is not kernel:<op>:<call> (e.g. kernel:gemm_fp8:3)", s);
  f.op = rest.substr(0, colon);
  const std::string num = rest.substr(colon + 1);
  char* end = nullptr;
  f.call = std::strtoull(num.c_str(), &end, 10);
  DI_CHECK(end && *end == '\0' && num.find_first_not_of("0123456789") == std::string::npos,
           "DEEPINFER_FAULT='{}': call index '{}' is not a non-negative integer (form: kernel:<op>:<call>)", s, num);
  f.armed = true;
  return f;
}
}  // namespace

KernelBackend current_backend() {
  if (t_backend_override >= 0) return KernelBackend(t_backend_override);
  return knobs().kernels;
}

ScopedBackend::ScopedBackend(KernelBackend b) : saved_(t_backend_override) { t_backend_override = int(b); }
ScopedBackend::~ScopedBackend() { t_backend_override = saved_; }

ThreadPool& kernel_pool() {
  ThreadPool* pool = scoped_pool();
  return pool ? *pool : global_pool();
}

uint64_t next_call_index(const char* op) {
  for (auto& c : t_counters)
    if (c.op == op || std::strcmp(c.op, op) == 0) return c.count++;
  t_counters.push_back({op, 1});
  return 0;
}

void reset_call_counters() { t_counters.clear(); }

bool fault_matches(const char* op, uint64_t index) {
  const std::string& knob = knobs().fault;
  if (knob.empty()) return false;
  thread_local FaultSpec spec;
  if (spec.source != knob) spec = parse_fault(knob);
  return spec.armed && spec.call == index && spec.op == op;
}

void perturb_buffer(const BufferSlot& s) {
  if (s.numel == 0) return;
  auto f = [](float x) { return 1.5f * x + 1.0f; };
  switch (s.dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(s.ptr);
      for (int64_t i = 0; i < s.numel; ++i) p[i] = f(p[i]);
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(s.ptr);
      for (int64_t i = 0; i < s.numel; ++i) p[i] = 1.5 * p[i] + 1.0;
      return;
    }
    case DType::bf16: {
      auto* p = static_cast<bf16*>(s.ptr);
      for (int64_t i = 0; i < s.numel; ++i) p[i] = f32_to_bf16(f(bf16_to_f32(p[i])));
      return;
    }
    case DType::e4m3: {
      auto* p = static_cast<fp8_e4m3*>(s.ptr);
      for (int64_t i = 0; i < s.numel; ++i) p[i] = f32_to_e4m3(f(e4m3_to_f32(p[i])));
      return;
    }
    case DType::e5m2: {
      auto* p = static_cast<fp8_e5m2*>(s.ptr);
      for (int64_t i = 0; i < s.numel; ++i) p[i] = f32_to_e5m2(f(e5m2_to_f32(p[i])));
      return;
    }
    default:
      *static_cast<uint8_t*>(s.ptr) ^= 1u;  // little-endian: the lowest bit of element 0
      return;
  }
}

namespace detail {
void apply_fault(const std::vector<BufferSlot>& slots) {
  for (const auto& s : slots) {
    if (s.role == BufferRole::in) continue;
    perturb_buffer(s);
    return;
  }
}
}  // namespace detail

}  // namespace deepinfer::kernels
