#include "kernels/registry.h"

#include <array>
#include <cstring>
#include <string_view>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/engram.h"
#include "kernels/gemm.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"

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
  const FaultKnob k = parse_fault_knob(s);
  return {s, true, k.op, k.call};
}
}  // namespace

KernelBackend backend_from_knobs() {
  return knobs().kernels == "host" ? KernelBackend::host : KernelBackend::cpu;
}

KernelBackend current_backend() {
  if (t_backend_override >= 0) return KernelBackend(t_backend_override);
  return backend_from_knobs();
}

std::span<const std::string_view> op_names() {
  static constexpr std::array<std::string_view, 38> kNames{
      OpSpec<QuantTokenParams>::name,
      OpSpec<QuantBlockParams>::name,
      OpSpec<DequantTokenParams>::name,
      OpSpec<DequantBlockParams>::name,
      OpSpec<GemmFp8Params>::name,
      OpSpec<GemmFp8GroupedContiguousParams>::name,
      OpSpec<GemmFp8GroupedMaskedParams>::name,
      OpSpec<GemmBf16Params>::name,
      OpSpec<RmsNormParams>::name,
      OpSpec<ResidualAddParams>::name,
      OpSpec<BiasAddParams>::name,
      OpSpec<RopeParams>::name,
      OpSpec<MlaPrefillParams>::name,
      OpSpec<MlaDecodeParams>::name,
      OpSpec<RouterParams>::name,
      OpSpec<SamplingParams>::name,
      OpSpec<SwigluParams>::name,
      OpSpec<EngramHashParams>::name,
      OpSpec<EngramGateParams>::name,
      OpSpec<EngramConvNormParams>::name,
      OpSpec<EngramShortConvParams>::name,
      OpSpec<MhcPreParams>::name,
      OpSpec<MhcPostParams>::name,
      OpSpec<MhcHeadParams>::name,
      OpSpec<FusedMappingParams>::name,
      OpSpec<ExpandToFusedParams>::name,
      OpSpec<ReduceFusedParams>::name,
      OpSpec<TopkGateParams>::name,
      OpSpec<TopkGroupParams>::name,
      OpSpec<NormalizeWeightParams>::name,
      OpSpec<GroupCountParams>::name,
      OpSpec<MaskIndicesByTpParams>::name,
      OpSpec<CastE2m1Params>::name,
      OpSpec<CastBackE2m1Params>::name,
      OpSpec<CastE5m6Params>::name,
      OpSpec<CastBackE5m6Params>::name,
      OpSpec<CastE2m1ToE4m3Params>::name,
      OpSpec<PerChannelCastParams>::name,
  };
  return kNames;
}

void check_fault_knob() {
  const std::string& value = knobs().fault;
  if (value.empty()) return;
  const FaultKnob f = parse_fault_knob(value);
  for (std::string_view op : op_names())
    if (f.op == op) return;
  std::string known;
  for (std::string_view op : op_names())
    known += fmt::format("{}{}", known.empty() ? "" : ", ", op);
  DI_FAIL(
      "DEEPINFER_FAULT='{}' is not valid: '{}' is not a kernel op; allowed values: "
      "kernel:<op>:<call> with op one of {}",
      value, f.op, known);
}

ScopedBackend::ScopedBackend(KernelBackend b) : saved_(t_backend_override) {
  t_backend_override = int(b);
}
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

namespace deepinfer {
std::string_view to_string(KernelBackend v) { return v == KernelBackend::host ? "host" : "cpu"; }
}  // namespace deepinfer
