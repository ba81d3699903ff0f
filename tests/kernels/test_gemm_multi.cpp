// gemm_fp8_multi, several independent fp8 GEMMs in one call (docs/performance.md §8): each
// problem must get the bytes a gemm_fp8 call of it alone gets, in every decode kernel mode and
// whatever mix of shapes shares the call (some take the decode layout kernel in the one pool
// dispatch, the others run alone), and lie within rounding of the host reference. The host backend
// and a recording see one gemm_fp8 call per problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/gemm.h"
#include "kernels/recorder.h"
#include "kernels/registry.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

struct Shape {
  int64_t m, n, k;
  bool decode_layout;
};

// Decode layout shapes of M = 1..8, M > 8 (8-row chunks when batch invariant, 16-row tiles on AMX,
// the prefill kernel otherwise), M = 0, and row-layout shapes (k % 128 != 0, or no layout given)
// between them.
const Shape kShapes[] = {{1, 256, 512, true}, {3, 200, 256, true},  {2, 130, 300, false},
                         {8, 96, 384, true},  {13, 160, 256, true}, {0, 64, 256, true},
                         {5, 64, 256, false}, {1, 100, 128, true},  {20, 64, 128, false},
                         {37, 96, 256, true}};

struct Problem {
  testing::Fp8Rows a, w;
  std::vector<uint8_t> decode;
  std::vector<bf16> out;  // [m, n], at least one element (every call needs an output pointer)
  size_t elems() const { return size_t(a.rows * w.rows); }
  GemmFp8Params params(bf16* dst) const {
    return {.a = a.q.data(),
            .a_scales = a.scales.data(),
            .w = w.q.data(),
            .w_scales = w.scales.data(),
            .out = dst,
            .m = a.rows,
            .n = w.rows,
            .k = a.k,
            .w_decode = decode.empty() ? nullptr : decode.data()};
  }
};

std::vector<Problem> make_problems() {
  std::vector<Problem> ps;
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    Problem p;
    p.a = testing::random_fp8_activations(s.m, s.k, seed++);
    p.w = testing::random_fp8_weights(s.n, s.k, seed++);
    if (s.decode_layout && decode_layout_bytes(s.n, s.k) > 0) {
      p.decode.resize(decode_layout_bytes(s.n, s.k));
      pack_decode_layout(p.w.q.data(), s.n, s.k, p.decode.data());
    }
    p.out.assign(size_t(std::max<int64_t>(s.m * s.n, 1)), bf16{0x7fc1});  // NaN: nothing wrote
    ps.push_back(std::move(p));
  }
  return ps;
}

struct DecodeMode {
  explicit DecodeMode(cpu::DecodeGemm m) { cpu::set_decode_gemm(m); }
  ~DecodeMode() { cpu::set_decode_gemm(cpu::DecodeGemm::automatic); }
};

TEST(GemmFp8Multi, EachProblemGetsTheBytesOfItsOwnCall) {
  // The modes, then (mode 4) the decode layout on AMX tiles where the CPU has them.
  const int modes = cpu::cpu_has_amx() ? 5 : 4;
  for (int mi = 0; mi < modes; ++mi) {
    const auto mode = mi < 4
                          ? std::array{cpu::DecodeGemm::automatic, cpu::DecodeGemm::invariant,
                                       cpu::DecodeGemm::rows, cpu::DecodeGemm::generic}[size_t(mi)]
                          : cpu::DecodeGemm::invariant;
    const DecodeMode use(mode);
    const cpu::ScopedAmx amx(mi == 4);
    if (mi == 4) {
      ASSERT_TRUE(cpu::amx_active());
    }
    std::vector<Problem> ps = make_problems();
    std::vector<GemmFp8Params> params;
    for (Problem& p : ps) params.push_back(p.params(p.out.data()));
    cpu::gemm_fp8_multi(params);
    for (size_t i = 0; i < ps.size(); ++i) {
      const Problem& p = ps[i];
      std::vector<bf16> alone(p.out.size()), host(p.out.size());
      cpu::gemm_fp8(p.params(alone.data()));
      host::gemm_fp8(p.params(host.data()));
      const std::string what = (mi == 4 ? "amx mode " : "mode ") + std::to_string(int(mode)) +
                               " problem " + std::to_string(i) + " m=" + std::to_string(p.a.rows) +
                               " n=" + std::to_string(p.w.rows) + " k=" + std::to_string(p.a.k);
      EXPECT_EQ(std::memcmp(p.out.data(), alone.data(), p.elems() * sizeof(bf16)), 0)
          << what << ": differs from gemm_fp8 of the problem alone";
      // Host: the same products, fp32 sums in another order, one bf16 rounding each.
      for (int64_t r = 0; r < p.a.rows; ++r) {
        float peak = 0.0f;
        const int64_t n = p.w.rows;
        for (int64_t j = 0; j < n; ++j)
          peak = std::max(peak, std::fabs(bf16_to_f32(host[size_t(r * n + j)])));
        for (int64_t j = 0; j < n; ++j) {
          const float got = bf16_to_f32(p.out[size_t(r * n + j)]),
                      want = bf16_to_f32(host[size_t(r * n + j)]);
          ASSERT_LE(std::fabs(got - want), 8e-3f * peak)
              << what << " row " << r << " col " << j << ": " << got << " vs host " << want;
        }
      }
    }
  }
}

// The streaming GEMMs' pool cut: one range a thread for a call worth under kPerThreadBelow,
// tapering chunks from there (docs/performance.md §5).
TEST(GemmFp8Multi, StreamingCallsCutOneRangeAThreadWhenShortAndTaperWhenLong) {
  ThreadPool pool(2);
  const ScopedThreadPool use(pool);
  for (const int64_t work :
       {int64_t(1) << 20, cpu::kPerThreadBelow - 1, cpu::kPerThreadBelow, int64_t(64) << 20}) {
    std::mutex m;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    cpu::parallel_for_streaming(6400, work, [&](int64_t b, int64_t e) {
      std::lock_guard lock(m);
      ranges.emplace_back(b, e);
    });
    if (work < cpu::kPerThreadBelow) {
      ASSERT_EQ(ranges.size(), 2u) << "work " << work;
    } else {
      EXPECT_GT(ranges.size(), 4u) << "work " << work;
    }
  }
  // The work of M = 1 is its weight bytes; more rows count more.
  EXPECT_EQ(cpu::streaming_work(3 << 20, 1), 3 << 20);
  EXPECT_EQ(cpu::streaming_work(3 << 20, 16), 18 << 20);
}

// A call over the threshold (tapering chunks) gives each problem the bytes of its own call (one
// range a thread): the cut never changes a column's sums.
TEST(GemmFp8Multi, TaperedAndPerThreadCallsGiveTheSameBytes) {
  std::vector<Problem> ps;
  int64_t work = 0;
  for (uint64_t seed = 500; work < cpu::kPerThreadBelow; seed += 2) {
    Problem p;
    const int64_t m = seed % 3 == 0 ? 3 : 1, n = 1024, k = 2048;
    p.a = testing::random_fp8_activations(m, k, seed);
    p.w = testing::random_fp8_weights(n, k, seed + 1);
    p.decode.resize(decode_layout_bytes(n, k));
    if (p.decode.empty()) GTEST_SKIP() << "no decode layout on this CPU";
    pack_decode_layout(p.w.q.data(), n, k, p.decode.data());
    p.out.assign(size_t(m * n), bf16{0x7fc1});
    work += cpu::streaming_work(int64_t(p.decode.size()), m);
    ps.push_back(std::move(p));
  }
  ThreadPool pool(2);
  const ScopedThreadPool use(pool);
  std::vector<GemmFp8Params> params;
  for (Problem& p : ps) params.push_back(p.params(p.out.data()));
  cpu::gemm_fp8_multi(params);
  for (size_t i = 0; i < ps.size(); ++i) {
    std::vector<bf16> alone(ps[i].out.size());
    cpu::gemm_fp8(ps[i].params(alone.data()));
    EXPECT_EQ(std::memcmp(ps[i].out.data(), alone.data(), ps[i].elems() * sizeof(bf16)), 0)
        << "problem " << i << " m=" << ps[i].a.rows;
  }
}

struct CountingRecorder : Recorder {
  std::vector<std::string> ops;
  void on_call(const KernelCall& c) override { ops.emplace_back(c.op); }
};

TEST(GemmFp8Multi, HostAndRecordingSeeOneGemmPerProblem) {
  std::vector<Problem> ps = make_problems();
  std::vector<GemmFp8Params> params;
  for (Problem& p : ps) params.push_back(p.params(p.out.data()));
  {
    ScopedBackend host(KernelBackend::host);
    gemm_fp8_multi(params);
  }
  for (const Problem& p : ps) {
    std::vector<bf16> want(p.out.size());
    host::gemm_fp8(p.params(want.data()));
    EXPECT_EQ(std::memcmp(p.out.data(), want.data(), p.elems() * sizeof(bf16)), 0);
  }
  CountingRecorder rec;
  {
    ScopedRecorder r(&rec);
    ScopedBackend cpu(KernelBackend::cpu);
    gemm_fp8_multi(params);
  }
  EXPECT_EQ(rec.ops, std::vector<std::string>(ps.size(), "gemm_fp8"));
}

TEST(GemmFp8Multi, ABadProblemIsNamed) {
  std::vector<Problem> ps = make_problems();
  std::vector<GemmFp8Params> params;
  for (Problem& p : ps) params.push_back(p.params(p.out.data()));
  params[3].w_scales = nullptr;
  try {
    gemm_fp8_multi(params);
    FAIL() << "a null w_scales went through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_scales"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::kernels
