// Tensor storage: large blocks are cached for reuse instead of going back to the OS.
// Why: on a VM each first touch of a fresh page is a fault that exits to the hypervisor, and glibc
// hands large blocks back (munmap / heap trim) on free. An engine that allocates its activations
// and EP outputs every step then spends most of its time faulting (docs/performance.md §6).
// PyTorch's caching allocator answers the same problem the same way.
#include <deepinfer/tensor.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "core/log.h"

namespace deepinfer::detail {
namespace {

// Smaller blocks stay with malloc's own bins. Not much larger: malloc hands a freed block of a
// few hundred KiB to smaller requests and serves the next one from fresh pages at the top of its
// heap (the fp8 dispatch's 224 KiB scales did, docs/performance.md §6).
constexpr size_t kCacheFrom = size_t(64) << 10;
constexpr size_t kCacheLimit = size_t(4)
                               << 30;  // bytes kept idle at most; beyond, blocks are freed

// Rounds up to a size class: 4 classes per power of two (at most 25% slack), 64-byte multiple.
size_t size_class(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  if (bytes < kCacheFrom) return bytes;
  size_t step = size_t(1) << (63 - __builtin_clzll(bytes) - 2);
  return (bytes + step - 1) / step * step;
}

// Which thread freed a block. A thread gets back its own blocks first: their lines are still in
// its core's caches, while a block a peer rank's thread wrote last must first be pulled over from
// the peer's (docs/performance.md §6).
uint32_t thread_tag() {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t tag = next.fetch_add(1, std::memory_order_relaxed);
  return tag;
}

struct IdleBlock {
  void* p;
  uint32_t freed_by;
};

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<IdleBlock>> idle;  // size class -> blocks, most recently freed last
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
      c.idle[cls].push_back({p, thread_tag()});
      c.idle_bytes += cls;
      return;
    }
  }
  std::free(p);
}

}  // namespace

void tensor_error(const std::string& what) { throw InternalError(what); }

std::shared_ptr<std::byte> host_alloc(size_t bytes) {
  const size_t cls = size_class(std::max<size_t>(bytes, 1));
  void* p = nullptr;
  if (cls >= kCacheFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.idle.find(cls);
    if (it != c.idle.end() && !it->second.empty()) {
      std::vector<IdleBlock>& blocks = it->second;
      auto own = std::find_if(blocks.rbegin(), blocks.rend(),
                              [me = thread_tag()](const IdleBlock& b) { return b.freed_by == me; });
      auto take = own != blocks.rend() ? std::prev(own.base()) : std::prev(blocks.end());
      p = take->p;
      blocks.erase(take);
      c.idle_bytes -= cls;
    }
  }
  if (!p) p = std::aligned_alloc(64, cls);
  DI_CHECK(p, "out of memory allocating {} bytes of tensor storage", cls);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                    [cls](std::byte* q) { release(q, cls); });
}

size_t host_alloc_idle_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.idle_bytes;
}

namespace {

// Weight chunks: 2 MiB-aligned anonymous mappings with MADV_HUGEPAGE, so the weight stream of a
// decode step walks 2 MiB pages. On 4 KiB pages the hardware prefetcher stops at every page edge
// and each page costs a TLB walk: the decode GEMMs streamed 15-25% slower from DRAM
// (docs/performance.md §8). madvise is a request; where THP is off the chunk keeps 4 KiB pages.
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kWeightChunk = size_t(64) << 20;

// Once per process: a warning where the OS will not back weight storage with huge pages.
void warn_if_no_huge_pages() {
  static const bool once = [] {
    std::string mode;
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), mode);
    if (mode.find("[never]") != std::string::npos)
      log_warn(
          "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled = never): "
          "decode reads its weights through 4 KiB pages, 20-30% slower (docs/performance.md §8); "
          "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` as root turns them on");
    return true;
  }();
  (void)once;
}

std::shared_ptr<std::byte> map_chunk(size_t bytes) {
  warn_if_no_huge_pages();
  // Over-map by one huge page and trim both ends to get a 2 MiB-aligned range.
  const size_t span = bytes + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    DI_FAIL(
        "out of memory: could not map {} bytes of weight storage (the model's weights need "
        "more memory than this machine has free)",
        bytes);
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t lo = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (lo > base) ::munmap(raw, lo - base);
  if (base + span > lo + bytes)
    ::munmap(reinterpret_cast<void*>(lo + bytes), base + span - lo - bytes);
  ::madvise(reinterpret_cast<void*>(lo), bytes, MADV_HUGEPAGE);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(lo),
                                    [bytes](std::byte* q) { ::munmap(q, bytes); });
}

struct WeightArena {
  std::mutex mu;
  std::weak_ptr<std::byte> chunk;  // the chunk being filled: unmapped once its storage is all gone
  size_t used = 0, size = 0;
};

}  // namespace

std::shared_ptr<std::byte> weight_alloc(size_t bytes) {
  static WeightArena* arena = new WeightArena;  // never destroyed, as cache()
  bytes = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (bytes >= kWeightChunk) return map_chunk((bytes + kHugePage - 1) & ~(kHugePage - 1));
  std::lock_guard<std::mutex> lock(arena->mu);
  std::shared_ptr<std::byte> chunk = arena->chunk.lock();
  if (!chunk || arena->used + bytes > arena->size) {
    chunk = map_chunk(kWeightChunk);
    arena->chunk = chunk;
    arena->used = 0;
    arena->size = kWeightChunk;
  }
  std::byte* p = chunk.get() + arena->used;
  arena->used += bytes;
  return std::shared_ptr<std::byte>(chunk, p);  // keeps the chunk mapped
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
