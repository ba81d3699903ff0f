// The kernel framework: backend selection, call counting, tags, the recorder's host replay, and
// fault injection, on a small fake op whose backends give different answers.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/registry.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"

namespace deepinfer::kernels {
namespace {
// out = x + y (host) or x + y + 100 (cpu, so the backend that ran is visible); acc += x in place.
struct FakeParams {
  const float* x = nullptr;
  const float* y = nullptr;  // optional
  float* out = nullptr;
  float* acc = nullptr;  // in/out
  int64_t n = 0;
};
}  // namespace

template <>
struct OpSpec<FakeParams> {
  static constexpr const char* name = "test_fake";
  static std::string shape(const FakeParams& p) { return fmt::format("n={}", p.n); }
  template <class V>
  static void visit(FakeParams& p, V& v) {
    v.in("x", p.x, p.n);
    v.in("y", p.y, p.n);
    v.out("out", p.out, p.n);
    v.inout("acc", p.acc, p.n);
  }
};

namespace {
void fake_host(const FakeParams& p) {
  for (int64_t i = 0; i < p.n; ++i) {
    p.out[i] = p.x[i] + (p.y ? p.y[i] : 0.0f);
    p.acc[i] += p.x[i];
  }
}
void fake_cpu(const FakeParams& p) {
  fake_host(p);
  for (int64_t i = 0; i < p.n; ++i) p.out[i] += 100.0f;
}
void fake(const FakeParams& p) { dispatch(p, fake_host, fake_cpu); }

struct KnobGuard {
  Knobs saved = knobs();
  ~KnobGuard() { set_knobs(saved); }
};

TEST(Registry, BackendFromKnobAndScope) {
  KnobGuard g;
  Knobs k = knobs();
  k.kernels = "host";
  set_knobs(k);
  EXPECT_EQ(current_backend(), KernelBackend::host);
  {
    ScopedBackend use(KernelBackend::cpu);
    EXPECT_EQ(current_backend(), KernelBackend::cpu);
    {
      ScopedBackend inner(KernelBackend::host);
      EXPECT_EQ(current_backend(), KernelBackend::host);
    }
    EXPECT_EQ(current_backend(), KernelBackend::cpu);
    float x = 1, out = 0, acc = 0;
    fake({&x, nullptr, &out, &acc, 1});
    EXPECT_EQ(out, 101.0f);
  }
  float x = 1, out = 0, acc = 0;
  fake({&x, nullptr, &out, &acc, 1});
  EXPECT_EQ(out, 1.0f);
}

TEST(Registry, CallIndexPerOpAndThread) {
  reset_call_counters();
  EXPECT_EQ(next_call_index("a_op"), 0u);
  EXPECT_EQ(next_call_index("a_op"), 1u);
  EXPECT_EQ(next_call_index("b_op"), 0u);
  uint64_t other = 99;
  std::thread t([&] { other = next_call_index("a_op"); });
  t.join();
  EXPECT_EQ(other, 0u);
  reset_call_counters();
  EXPECT_EQ(next_call_index("a_op"), 0u);
}

TEST(Registry, TagsNest) {
  EXPECT_EQ(current_kernel_tag(), "");
  {
    KernelTag a("layer3");
    EXPECT_EQ(current_kernel_tag(), "layer3");
    {
      KernelTag b("moe");
      EXPECT_EQ(current_kernel_tag(), "layer3.moe");
    }
    EXPECT_EQ(current_kernel_tag(), "layer3");
  }
  EXPECT_EQ(current_kernel_tag(), "");
}

TEST(Registry, CollectAndRedirectSkipNullBuffers) {
  float x[2], out[2], acc[2];
  FakeParams p{x, nullptr, out, acc, 2};
  const auto slots = collect_buffers(p);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_STREQ(slots[0].name, "x");
  EXPECT_EQ(slots[1].role, BufferRole::out);
  EXPECT_EQ(slots[2].role, BufferRole::inout);
  EXPECT_EQ(slots[2].dtype, DType::f32);
  float x2[2], out2[2], acc2[2];
  const FakeParams q = redirect_buffers(p, {x2, out2, acc2});
  EXPECT_EQ(q.x, x2);
  EXPECT_EQ(q.y, nullptr);
  EXPECT_EQ(q.out, out2);
  EXPECT_EQ(q.acc, acc2);
}

struct CollectingRecorder : Recorder {
  struct Seen {
    std::string op, tag, shape;
    uint64_t index;
    KernelBackend backend;
    std::vector<std::vector<float>> inputs, outputs, host_outputs;
  };
  std::vector<Seen> seen;
  void on_call(const KernelCall& c) override {
    Seen s{std::string(c.op), std::string(c.tag), c.shape, c.index, c.backend, {}, {}, {}};
    auto flat = [](const CallBuffer& b) {
      const float* f = static_cast<const float*>(b.data);
      return std::vector<float>(f, f + b.numel);
    };
    for (const auto& b : c.inputs) s.inputs.push_back(flat(b));
    for (const auto& b : c.outputs) s.outputs.push_back(flat(b));
    for (const auto& t : c.replay_on_host())
      s.host_outputs.push_back(std::vector<float>(t.data<float>(), t.data<float>() + t.numel()));
    seen.push_back(std::move(s));
  }
};

TEST(Registry, RecorderSeesCallsAndReplaysOnHost) {
  CollectingRecorder rec;
  reset_call_counters();
  float x[3] = {1, 2, 3}, y[3] = {10, 20, 30}, out[3] = {}, acc[3] = {5, 5, 5};
  {
    ScopedRecorder r(&rec);
    ScopedBackend use(KernelBackend::cpu);
    KernelTag tag("layer0");
    fake({x, y, out, acc, 3});
    fake({x, nullptr, out, acc, 3});
  }
  float x3 = 1, out3 = 0, acc3 = 0;
  fake({&x3, nullptr, &out3, &acc3, 1});  // after the scope: not recorded
  ASSERT_EQ(rec.seen.size(), 2u);
  const auto& c0 = rec.seen[0];
  EXPECT_EQ(c0.op, "test_fake");
  EXPECT_EQ(c0.tag, "layer0");
  EXPECT_EQ(c0.shape, "n=3");
  EXPECT_EQ(c0.index, 0u);
  EXPECT_EQ(c0.backend, KernelBackend::cpu);
  ASSERT_EQ(c0.inputs.size(), 3u);  // x, y, acc (pre-call copy)
  EXPECT_EQ(c0.inputs[2], (std::vector<float>{5, 5, 5}));
  ASSERT_EQ(c0.outputs.size(), 2u);                               // out, acc
  EXPECT_EQ(c0.outputs[0], (std::vector<float>{111, 122, 133}));  // cpu
  EXPECT_EQ(c0.outputs[1], (std::vector<float>{6, 7, 8}));
  ASSERT_EQ(c0.host_outputs.size(), 2u);
  EXPECT_EQ(c0.host_outputs[0], (std::vector<float>{11, 22, 33}));  // host, from the copies
  EXPECT_EQ(c0.host_outputs[1], (std::vector<float>{6, 7, 8}));
  const auto& c1 = rec.seen[1];
  EXPECT_EQ(c1.index, 1u);
  ASSERT_EQ(c1.inputs.size(), 2u);  // y is null and skipped
  EXPECT_EQ(c1.inputs[1], (std::vector<float>{6, 7, 8}));
  EXPECT_EQ(c1.host_outputs[1], (std::vector<float>{7, 9, 11}));
  // The replays never touched the caller's buffers: acc holds two cpu updates only.
  EXPECT_EQ(acc[0], 7.0f);
  EXPECT_EQ(acc[2], 11.0f);
}

TEST(Registry, FaultPerturbsOnlyTheNamedCpuCall) {
  KnobGuard g;
  Knobs k = knobs();
  k.fault = "kernel:test_fake:1";
  set_knobs(k);
  reset_call_counters();
  ScopedBackend use(KernelBackend::cpu);
  float x = 2, out = 0, acc = 0;
  fake({&x, nullptr, &out, &acc, 1});
  EXPECT_EQ(out, 102.0f);
  fake({&x, nullptr, &out, &acc, 1});
  EXPECT_EQ(out, 1.5f * 102.0f + 1.0f);  // call 1: first output perturbed
  EXPECT_EQ(acc, 4.0f);                  // other outputs untouched
  fake({&x, nullptr, &out, &acc, 1});
  EXPECT_EQ(out, 102.0f);
  {
    ScopedBackend host(KernelBackend::host);
    reset_call_counters();
    fake({&x, nullptr, &out, &acc, 1});
    fake({&x, nullptr, &out, &acc, 1});
    EXPECT_EQ(out, 2.0f);  // the host reference is never perturbed
  }
}

TEST(Registry, BadFaultSpecIsAClearError) {
  KnobGuard g;
  Knobs k = knobs();
  k.fault = "kernel:gemm_fp8:x";
  set_knobs(k);
  ScopedBackend use(KernelBackend::cpu);
  float x = 2, out = 0, acc = 0;
  try {
    fake({&x, nullptr, &out, &acc, 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel:<op>:<call>"), std::string::npos) << e.what();
  }
}

TEST(Registry, OpNamesAreTheOpsNames) {
  std::set<std::string_view> names(op_names().begin(), op_names().end());
  EXPECT_EQ(names.size(), op_names().size()) << "a name listed twice";
  for (const char* op :
       {OpSpec<GemmFp8Params>::name, OpSpec<RmsNormParams>::name, OpSpec<SamplingParams>::name,
        OpSpec<MlaDecodeParams>::name, OpSpec<SwigluParams>::name})
    EXPECT_EQ(names.count(op), 1u) << op;
  EXPECT_EQ(names.count("test_fake"), 0u);
}

// DEEPINFER_FAULT names a kernel op that exists; core checked its form.
TEST(Registry, FaultKnobMustNameAKernelOp) {
  KnobGuard g;
  Knobs k = knobs();
  for (const char* ok : {"", "kernel:rms_norm:3", "kernel:gemm_fp8:0"}) {
    k.fault = ok;
    set_knobs(k);
    EXPECT_NO_THROW(check_fault_knob()) << ok;
  }
  k.fault = "kernel:nosuchop:0";
  set_knobs(k);
  try {
    check_fault_knob();
    ADD_FAILURE() << "an unknown op was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("DEEPINFER_FAULT='kernel:nosuchop:0' is not valid", 0), 0u) << msg;
    for (std::string_view op : op_names()) EXPECT_NE(msg.find(op), std::string::npos) << op;
  }
}

TEST(Registry, PerturbBufferTypes) {
  bf16 b[2] = {f32_to_bf16(2.0f), f32_to_bf16(-1.0f)};
  perturb_buffer({"b", DType::bf16, 2, b, BufferRole::out});
  EXPECT_EQ(bf16_to_f32(b[0]), 4.0f);
  EXPECT_EQ(bf16_to_f32(b[1]), -0.5f);
  int32_t ids[2] = {4, 4};
  perturb_buffer({"ids", DType::i32, 2, ids, BufferRole::out});
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 4);
}

}  // namespace
}  // namespace deepinfer::kernels
