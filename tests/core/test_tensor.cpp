// Tensor: shapes, strides, views, rows, clone, borrow, and the errors for bad requests.
#include <deepinfer/tensor.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace deepinfer {
namespace {

using Shape = std::vector<int64_t>;

// Expects `stmt` to throw deepinfer::Error whose message contains `needle`.
#define EXPECT_ERROR_WITH(stmt, needle)                                             \
  do {                                                                              \
    try {                                                                           \
      (void)(stmt);                                                                 \
      ADD_FAILURE() << #stmt << " did not throw";                                   \
    } catch (const Error& e) {                                                      \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

TEST(Tensor, EmptyHasContiguousStridesAndAlignment) {
  Tensor t = Tensor::empty(DType::bf16, {3, 4, 5});
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_EQ(t.shape(), (Shape{3, 4, 5}));
  EXPECT_EQ(t.strides(), (Shape{20, 5, 1}));
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(t.dim(0), 3);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.dim(-3), 3);
  EXPECT_TRUE(t.defined());
  EXPECT_TRUE(t.owning());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.describe(), "bf16[3, 4, 5]");
}

TEST(Tensor, ByteSizesFollowDtype) {
  const std::pair<DType, size_t> sizes[] = {{DType::f32, 4},  {DType::f64, 8},  {DType::bf16, 2},
                                            {DType::e4m3, 1}, {DType::e5m2, 1}, {DType::i8, 1},
                                            {DType::u8, 1},   {DType::i32, 4},  {DType::i64, 8}};
  for (auto [dt, bytes] : sizes) {
    EXPECT_EQ(dtype_size(dt), bytes) << dtype_name(dt);
    EXPECT_EQ(Tensor::empty(dt, {7}).nbytes(), 7 * bytes) << dtype_name(dt);
  }
}

TEST(Tensor, ZerosAreZeroAndZeroSizedShapesWork) {
  Tensor z = Tensor::zeros(DType::i32, {5, 3});
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.data<int32_t>()[i], 0);
  Tensor none = Tensor::zeros(DType::f32, {0, 8});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.nbytes(), 0u);
  EXPECT_TRUE(none.defined());  // storage exists even for zero elements
  EXPECT_EQ(none.strides(), (Shape{8, 1}));
  Tensor scalar = Tensor::zeros(DType::f64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.ndim(), 0);
  EXPECT_EQ(scalar.data<double>()[0], 0.0);
}

TEST(Tensor, ViewSharesStorage) {
  Tensor t = Tensor::empty(DType::f32, {2, 6});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i);
  Tensor v = t.view({3, 4});
  EXPECT_EQ(v.raw(), t.raw());
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  v.data<float>()[5] = 100.0f;
  EXPECT_EQ(t.data<float>()[5], 100.0f);
  EXPECT_EQ(t.view({12}).numel(), 12);
  EXPECT_EQ(t.view({1, 12, 1}).strides(), (Shape{12, 1, 1}));
}

TEST(Tensor, BadViewsAreErrors) {
  Tensor t = Tensor::empty(DType::f32, {2, 6});
  EXPECT_ERROR_WITH(t.view({5, 2}), "view of 12 elements as 10 elements");
  EXPECT_ERROR_WITH(t.view({-2, -6}), "negative size");  // numel would match: 12
  float buf[16] = {};
  Tensor strided = Tensor::borrow(buf, DType::f32, {4, 2}, {4, 1});  // every other pair
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_ERROR_WITH(strided.view({8}), "contiguous");
  EXPECT_ERROR_WITH(strided.clone(), "contiguous");
}

TEST(Tensor, RowsShareStorageAndCheckRange) {
  Tensor t = Tensor::empty(DType::i64, {5, 3});
  for (int i = 0; i < 15; ++i) t.data<int64_t>()[i] = i;
  Tensor r = t.rows(1, 4);  // [3, 3]
  EXPECT_EQ(r.shape(), (Shape{3, 3}));
  EXPECT_EQ(r.data<int64_t>()[0], 3);
  EXPECT_EQ(r.data<int64_t>()[8], 11);
  EXPECT_TRUE(r.is_contiguous());
  r.data<int64_t>()[0] = -1;
  EXPECT_EQ(t.data<int64_t>()[3], -1);
  EXPECT_EQ(t.rows(5, 5).numel(), 0);
  EXPECT_EQ(t.rows(2, 4).rows(1, 2).data<int64_t>()[0], 9);
  EXPECT_ERROR_WITH(t.rows(2, 6), "rows [2, 6) out of range for dim0 = 5");
  EXPECT_ERROR_WITH(t.rows(3, 2), "out of range");
  EXPECT_ERROR_WITH(t.rows(-1, 2), "out of range");
  EXPECT_ERROR_WITH(Tensor::zeros(DType::f32, {}).rows(0, 0), "out of range");
  // Rows of a strided tensor step by its row stride.
  int32_t buf[12];
  for (int i = 0; i < 12; ++i) buf[i] = i;
  Tensor s = Tensor::borrow(buf, DType::i32, {3, 2}, {4, 1});
  EXPECT_EQ(s.rows(2, 3).data<int32_t>()[0], 8);
}

TEST(Tensor, RowsKeepStorageAlive) {
  Tensor r;
  {
    Tensor t = Tensor::empty(DType::f32, {4, 2});
    for (int i = 0; i < 8; ++i) t.data<float>()[i] = float(i);
    r = t.rows(2, 4);
  }
  EXPECT_TRUE(r.owning());
  EXPECT_EQ(r.data<float>()[3], 7.0f);
}

TEST(Tensor, CloneIsADeepCopy) {
  Tensor t = Tensor::empty(DType::u8, {3, 3});
  for (int i = 0; i < 9; ++i) t.data<uint8_t>()[i] = uint8_t(i * 7);
  Tensor c = t.rows(1, 3).clone();
  EXPECT_NE(c.raw(), t.raw());
  EXPECT_TRUE(c.owning());
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.data<uint8_t>()[i], uint8_t((i + 3) * 7));
  t.data<uint8_t>()[3] = 0;
  EXPECT_EQ(c.data<uint8_t>()[0], 21);
  EXPECT_FALSE(Tensor().clone().defined());
  EXPECT_EQ(Tensor::empty(DType::f32, {0}).clone().numel(), 0);
}

TEST(Tensor, BorrowDoesNotOwn) {
  std::vector<float> mem(6, 1.5f);
  Tensor b = Tensor::borrow(mem.data(), DType::f32, {2, 3});
  EXPECT_FALSE(b.owning());
  EXPECT_TRUE(b.defined());
  EXPECT_EQ(b.raw(), mem.data());
  EXPECT_EQ(b.strides(), (Shape{3, 1}));
  b.data<float>()[4] = 2.5f;
  EXPECT_EQ(mem[4], 2.5f);
  Tensor c = b.clone();
  EXPECT_TRUE(c.owning());
  EXPECT_EQ(c.data<float>()[4], 2.5f);
  EXPECT_ERROR_WITH(Tensor::borrow(mem.data(), DType::f32, {2, 3}, {3}),
                    "strides rank 1 != shape rank 2");
  EXPECT_ERROR_WITH(Tensor::borrow(mem.data(), DType::f32, {2, -3}),
                    "negative size -3 for dimension 1");
}

TEST(Tensor, DefaultIsUndefinedAndDimChecksRange) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_FALSE(t.owning());
  Tensor e = Tensor::empty(DType::f32, {2, 3});
  EXPECT_ERROR_WITH(e.dim(2), "dim 2 out of range for a 2-d tensor");
  EXPECT_ERROR_WITH(e.dim(-3), "dim -3 out of range");
  EXPECT_ERROR_WITH(Tensor::empty(DType::f32, {4, -1}), "negative size");
}

// Large storage goes back to a cache on release and the next tensor of its size class takes it
// (no fresh pages to fault in); live tensors never share storage; every block is 64-byte aligned.
TEST(TensorStorage, LargeBlocksAreReusedNotShared) {
  const std::vector<int64_t> shape{1 << 20};  // 4 MiB of f32
  Tensor a = Tensor::empty(DType::f32, shape);
  Tensor b = Tensor::empty(DType::f32, shape);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()) % 64, 0u);
  EXPECT_NE(a.raw(), b.raw());
  const size_t idle_live = detail::host_alloc_idle_bytes();
  const void* released = a.raw();
  a = Tensor();
  const size_t idle_released = detail::host_alloc_idle_bytes();
  EXPECT_GE(idle_released, idle_live + (size_t(4) << 20)) << "a released 4 MiB block was not kept";
  std::fill_n(b.data<float>(), b.numel(), 1.0f);
  Tensor c = Tensor::empty(DType::f32, shape);
  EXPECT_EQ(c.raw(), released);
  EXPECT_EQ(detail::host_alloc_idle_bytes(), idle_live)
      << "the reuse did not take the block from the cache";
  // zeros() clears a reused block.
  std::fill_n(c.data<float>(), c.numel(), 1.0f);
  c = Tensor();
  Tensor z = Tensor::zeros(DType::f32, shape);
  const float* zp = z.data<float>();
  EXPECT_EQ(std::count(zp, zp + z.numel(), 0.0f), z.numel());
}

// Mid-size storage (here 224 KiB, an fp8 dispatch's scales for 1024 rows) is cached as well:
// malloc would serve it from fresh pages again and again until its bins settle.
TEST(TensorStorage, MidSizeBlocksAreCachedToo) {
  const std::vector<int64_t> shape{1024, 56};  // f32
  Tensor a = Tensor::empty(DType::f32, shape);
  const void* at = a.raw();
  const size_t idle_live = detail::host_alloc_idle_bytes();
  a = Tensor();
  EXPECT_GE(detail::host_alloc_idle_bytes(), idle_live + size_t(1024 * 56 * 4))
      << "the freed block was not kept";
  Tensor again = Tensor::empty(DType::f32, shape);
  EXPECT_EQ(again.raw(), at);
}

// A thread gets back the block it freed itself before one another thread freed later: its own is
// still in its core's caches (local rank threads each reuse their own output blocks). A thread
// with no block of its own takes the most recently freed one.
TEST(TensorStorage, AThreadTakesBackItsOwnBlockFirst) {
  const std::vector<int64_t> shape{3 << 18};  // 3 MiB of f32
  Tensor a = Tensor::empty(DType::f32, shape);
  Tensor b = Tensor::empty(DType::f32, shape);
  const void* a_at = a.raw();
  const void* b_at = b.raw();
  a = Tensor();                               // freed by this thread
  std::thread([&] { b = Tensor(); }).join();  // freed later, by another thread
  Tensor again = Tensor::empty(DType::f32, shape);
  EXPECT_EQ(again.raw(), a_at);
  const void* fresh_thread_got = nullptr;
  std::thread([&] { fresh_thread_got = Tensor::empty(DType::f32, shape).raw(); }).join();
  EXPECT_EQ(fresh_thread_got, b_at);
}

// After keep_freed_host_memory, a freed block below the mmap threshold is reused with its pages
// still mapped: touching it again takes no page faults (glibc would otherwise trim the heap or
// unmap the block on free, and every cycle would fault the pages back in).
TEST(HostMemory, FreedBlocksStayMappedAfterKeepFreedHostMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator replaces glibc's: mallopt has nothing to keep";
#endif
  keep_freed_host_memory();
  constexpr size_t kBytes = size_t(2) << 20;  // 512 pages
  auto cycle = [] {
    std::vector<char> v(kBytes, 1);  // allocate, touch every page, free
    return v[kBytes / 2];
  };
  int sink = cycle();
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  for (int i = 0; i < 20; ++i) sink += cycle();
  getrusage(RUSAGE_THREAD, &after);
  EXPECT_LT(after.ru_minflt - before.ru_minflt, 64)
      << "freed memory went back to the OS (sink " << sink << ")";
}

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("" if none).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2)
      inside = at >= lo && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

bool page_mapped(const void* p) {
  const long page = sysconf(_SC_PAGESIZE);
  void* base = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(page - 1));
  unsigned char v = 0;
  return mincore(base, size_t(page), &v) == 0;  // ENOMEM: nothing mapped there
}

// Weight storage: 64-byte aligned, never overlapping, in mappings marked for transparent huge
// pages ("hg" in VmFlags, where the kernel has them); a chunk goes back to the OS when the last
// storage in it is released, and a block of a whole chunk or more is its own 2 MiB-aligned one.
TEST(WeightStorage, AlignedDisjointHugePageMappingsReleasedWithTheirLastUser) {
  std::vector<std::shared_ptr<std::byte>> small;
  const std::vector<size_t> sizes{1, 100, 4096, 3 << 20, 64, 1 << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    small.push_back(detail::weight_alloc(sizes[i]));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.back().get()) % 64, 0u);
    std::memset(small.back().get(), int(i + 1), sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(small[i].get());
    EXPECT_EQ(std::count(p, p + sizes[i], static_cast<unsigned char>(i + 1)), long(sizes[i]))
        << "block " << i << " was overwritten by another";
    if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
      EXPECT_NE(vm_flags_of(p).find(" hg"), std::string::npos) << vm_flags_of(p);
    }
  }
  const void* first = small.front().get();
  small.clear();  // every small block gone (nothing else in this binary holds weight storage)
  EXPECT_FALSE(page_mapped(first)) << "a weight chunk stayed mapped after its last block went";

  const size_t big = size_t(65) << 20;
  auto whole = detail::weight_alloc(big);
  const void* at = whole.get();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % (size_t(2) << 20), 0u);
  static_cast<volatile std::byte*>(whole.get())[big - 1] = std::byte{7};
  EXPECT_TRUE(page_mapped(at));
  auto alias = whole;  // a second user keeps it mapped
  whole.reset();
  EXPECT_TRUE(page_mapped(at));
  alias.reset();
  EXPECT_FALSE(page_mapped(at)) << "a released weight chunk stayed mapped";
}

}  // namespace
}  // namespace deepinfer
