// Helpers for the comm tests: payloads whose expected value is computable from (rank, index).
#pragma once

#include <deepinfer/comm.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace deepinfer::test {

// splitmix64 finaliser: an independent, well-mixed value for (a, b, c).
inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c = 0) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b * 0xBF58476D1CE4E5B9ull + c * 0x94D049BB133111EBull +
               0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Bytes of element `i` of the payload tagged (a, b): es bytes of mix(a, b, i).
inline void fill_payload(std::byte* out, size_t count, size_t es, uint64_t a, uint64_t b) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t v = mix(a, b, i);
    std::memcpy(out + i * es, &v, es);
  }
}

inline std::vector<std::byte> payload(size_t count, size_t es, uint64_t a, uint64_t b) {
  std::vector<std::byte> v(count * es);
  fill_payload(v.data(), count, es, a, b);
  return v;
}

// Group::expose over five rounds whose sizes grow (the mpi window is re-allocated) and differ by
// rank, with a region empty on rank 0 and one empty everywhere: every rank reads every rank's
// payload. Region 0 is built in Group::expose_staging where it offers a place, including a round
// whose other regions make the window grow under it (the regions move to the new window).
// Returns the regions that came back wrong (0 = pass); *staged: the rounds that built in place.
inline int expose_mismatches(Group& g, int* staged = nullptr) {
  const int n = g.size(), me = g.rank();
  int bad = 0;
  if (staged) *staged = 0;
  for (uint64_t round = 1; round <= 5; ++round) {
    // Past the mpi window's first 1 MiB by round 2 at small worlds (kept small at 64 ranks).
    const uint64_t grow = std::min<uint64_t>(round, 3);
    const size_t big = n <= 4 ? grow * grow * grow * grow * 100000 : grow * 1000;
    // Round 4: region 1 alone outgrows the window that region 0 was staged in. Only a window
    // has that case; in one address space (local, up to 64 ranks) a large region would only make
    // every rank check n of them, which at 64 ranks outlasted the collectives' deadline.
    const bool window = g.peer_memory() == PeerMemory::window;
    const size_t extra = round != 4 ? 0
                         : !window  ? 4096
                         : n <= 4   ? size_t(4) << 20
                                    : size_t(1100) << 10;
    auto size_of = [&](int r, size_t i) {
      return i == 0 ? big + size_t(r) * 7 : i == 1 ? extra + size_t(r) * 13 : 0;
    };
    std::vector<std::vector<std::byte>> mine;
    std::vector<std::span<const std::byte>> regions;
    for (size_t i = 0; i < 3; ++i)
      mine.push_back(payload(size_of(me, i), 1, round * 10 + i, uint64_t(me)));
    for (const auto& m : mine) regions.emplace_back(m.data(), m.size());
    if (std::byte* at = g.expose_staging(mine[0].size())) {
      std::memcpy(at, mine[0].data(), mine[0].size());
      regions[0] = std::span<const std::byte>(at, mine[0].size());
      if (staged) ++*staged;
    }
    std::vector<const std::byte*> peers;
    g.expose(regions, peers);
    if (peers.size() != size_t(n) * 3) return 1000;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < 3; ++i) {
        const auto want = payload(size_of(r, i), 1, round * 10 + i, uint64_t(r));
        bad +=
            !want.empty() && std::memcmp(peers[size_t(r) * 3 + i], want.data(), want.size()) != 0;
      }
    g.barrier();
  }
  return bad;
}

// Group::expose_writable over two rounds (the second with region 0 built in expose_staging where
// it offers a place): every rank writes its 16-byte block into every rank's two regions, whose
// last 40 bytes nobody writes. After the closing barrier each rank finds every peer's block in
// its own regions and the unwritten tail unchanged. Returns the wrong blocks (0 = pass).
inline int expose_writable_mismatches(Group& g) {
  const int n = g.size(), me = g.rank();
  const size_t block = 16, tail = 40, bytes = size_t(n) * block + tail;
  int bad = 0;
  for (uint64_t round = 1; round <= 2; ++round) {
    std::vector<std::vector<std::byte>> mine;
    std::vector<std::span<std::byte>> regions;
    for (size_t i = 0; i < 2; ++i)
      mine.push_back(payload(bytes, 1, round * 10 + i, 1000 + uint64_t(me)));
    for (auto& m : mine) regions.emplace_back(m.data(), m.size());
    std::byte* staged = round == 2 ? g.expose_staging(bytes) : nullptr;
    if (staged) {
      std::memcpy(staged, mine[0].data(), bytes);
      regions[0] = std::span<std::byte>(staged, bytes);
    }
    std::vector<std::byte*> peers;
    g.expose_writable(regions, peers);
    if (peers.size() != size_t(n) * 2) return 1000;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < 2; ++i) {
        const auto b = payload(block, 1, round * 10 + i, uint64_t(me) * 64 + uint64_t(r));
        std::memcpy(peers[size_t(r) * 2 + i] + size_t(me) * block, b.data(), block);
      }
    g.barrier();
    for (size_t i = 0; i < 2; ++i) {
      const std::byte* got = regions[i].data();
      for (int s = 0; s < n; ++s) {
        const auto want = payload(block, 1, round * 10 + i, uint64_t(s) * 64 + uint64_t(me));
        bad += std::memcmp(got + size_t(s) * block, want.data(), block) != 0;
      }
      const auto orig = payload(bytes, 1, round * 10 + i, 1000 + uint64_t(me));
      bad += std::memcmp(got + size_t(n) * block, orig.data() + size_t(n) * block, tail) != 0;
    }
  }
  return bad;
}

inline LaunchOptions local_opts(int world, double timeout_s = 20.0, std::string fault = {}) {
  LaunchOptions o;
  o.comm = CommKind::local;
  o.world = world;
  o.timeout_s = timeout_s;
  o.fault = std::move(fault);
  return o;
}

}  // namespace deepinfer::test
