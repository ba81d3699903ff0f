// Tensor storage: large blocks are cached for reuse instead of going back to the OS.
// Why: on a VM each first touch of a fresh page is a fault that exits to the hypervisor (about
// 15 us on the CI machine), and glibc hands large blocks back (munmap / heap trim) on free. An
// engine that allocates its activations and EP outputs every step then spends most of its time
// faulting: bench ep at W=2 took 96k faults in 1.5 s. PyTorch's caching allocator answers the same
// problem the same way.
#include <deepinfer/tensor.h>

#include <malloc.h>

#include <map>
#include <mutex>
#include <vector>

namespace deepinfer::detail {
namespace {

constexpr size_t kCacheFrom = size_t(256) << 10;  // smaller blocks stay with malloc's own bins
constexpr size_t kCacheLimit = size_t(4) << 30;   // bytes kept idle at most; beyond, blocks are freed

// Rounds up to a size class: 4 classes per power of two (at most 25% slack), 64-byte multiple.
size_t size_class(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  if (bytes < kCacheFrom) return bytes;
  size_t step = size_t(1) << (63 - __builtin_clzll(bytes) - 2);
  return (bytes + step - 1) / step * step;
}

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> idle;  // size class -> blocks
  size_t idle_bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may outlive static destruction
  return *c;
}

void release(void* p, size_t cls) {
  if (cls >= kCacheFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.idle_bytes + cls <= kCacheLimit) {
      c.idle[cls].push_back(p);
      c.idle_bytes += cls;
      return;
    }
  }
  std::free(p);
}

}  // namespace

std::shared_ptr<std::byte> host_alloc(size_t bytes) {
  const size_t cls = size_class(std::max<size_t>(bytes, 1));
  void* p = nullptr;
  if (cls >= kCacheFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.idle.find(cls);
    if (it != c.idle.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      c.idle_bytes -= cls;
    }
  }
  if (!p) p = std::aligned_alloc(64, cls);
  DI_CHECK(p, "out of memory allocating {} bytes of tensor storage", cls);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [cls](std::byte* q) { release(q, cls); });
}

size_t host_alloc_idle_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.idle_bytes;
}

}  // namespace deepinfer::detail

namespace deepinfer {

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  // Fixed thresholds also switch off glibc's dynamic ones. Blocks from 32 MiB still get their own
  // mapping (and Tensor storage that large is cached above).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace deepinfer
