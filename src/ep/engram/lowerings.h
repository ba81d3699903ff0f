// The EngramBuffer lowerings (docs/ep.md §12): each a free function over one Context that moves
// the rows a fetch asks for and places them into the caller's output. Output slots of index -1
// are zeroed by the facade beforehand and left alone here.
#pragma once

#include <deepinfer/comm.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::ep::engram {

struct Context {
  Group& group;
  int world = 1, rank = 0;
  int64_t n = 0;                     // rows per rank
  size_t data_bytes = 0;             // H · itemsize
  size_t sf_bytes = 0;               // P · 4 (0 for bf16)
  const std::byte* shard = nullptr;  // [n, data_bytes]
  const std::byte* sf = nullptr;     // [n, sf_bytes] or nullptr
  // Direct: where each rank's shard (and sf) is readable from here, 1 or 2 regions per rank.
  std::vector<const std::byte*> peers;

  // Scratch the lowerings reuse across fetches (grown on demand, never shrunk): a fresh buffer
  // per call would fault its pages in again every time.
  std::vector<std::byte> send, recv;
  std::vector<int32_t> ids;

  explicit Context(Group& g) : group(g) {}
  size_t entry_bytes() const { return data_bytes + sf_bytes; }
  // Copies local row `row` as one entry [data | sf] to dst.
  void pack_entry(int64_t row, std::byte* dst) const;
};

// One fetch: this rank's flattened indices and where their rows go.
struct Request {
  std::span<const int32_t> idx;        // T·J, each in [-1, W·n)
  std::span<const int32_t> ids;        // distinct_ids(idx)
  std::span<const int64_t> counts;     // [W] every rank's T·J (agreed)
  std::span<const int64_t> owner_cnt;  // [W·W] row r: rank r's distinct ids per owner (agreed)
  std::byte* data_out = nullptr;       // [T·J, data_bytes]
  std::byte* sf_out = nullptr;         // [T·J, sf_bytes] or nullptr
};

// The sorted distinct valid ids of idx: owner-major, so owner o's ids form one segment.
std::vector<int32_t> distinct_ids(std::span<const int32_t> idx);
// Places entry e (as pack_entry wrote it) into output slot p.
void place_entry(const Context& c, const Request& r, const std::byte* e, size_t p);
// For each valid slot: its id's position in the sorted `ids`; the entry there is placed.
void place_from(const Context& c, const Request& r, std::span<const int32_t> ids,
                const std::byte* entries);

void fetch_ag(Context& c, const Request& r);      // engram_ag.cpp
void fetch_a2a(Context& c, const Request& r);     // engram_a2a.cpp
void fetch_direct(Context& c, const Request& r);  // engram_direct.cpp

}  // namespace deepinfer::ep::engram
