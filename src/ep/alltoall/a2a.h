// Algorithm `a2a`, its transport: the W×W split matrix is all-gathered (the plan), so every rank
// sees the same matrix and picks the same lowering (ep/path.h); records then move by one
// all_to_all of that lowering. The lowerings that use it are the other files of alltoall/.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::ep::a2a {

enum class Lowering : uint8_t {
  even,    // every split equal: all_to_all
  v,       // all_to_all_v (backend trusts it)
  padded,  // all_to_all padded to the global max split
};
std::string_view to_string(Lowering l);

struct Plan {
  int world = 1;
  std::vector<int64_t> split;  // [W, W]: records rank i sends rank j
  int64_t max_split = 0;
  int64_t total = 0;            // records all ranks send in all
  int first_invalid_rank = -1;  // lowest rank that passed invalid input (split left empty), or -1
  bool all_x_in_place = false;  // every rank's x lies where its next expose finds it in place
  int64_t send(int i, int j) const { return split[size_t(i) * size_t(world) + size_t(j)]; }
  // Where rank i's records for rank j start in i's send list (ranks in order).
  int64_t send_offset(int i, int j) const {
    int64_t o = 0;
    for (int d = 0; d < j; ++d) o += send(i, d);
    return o;
  }
  // Where rank i's records start among rank j's received ones (source ranks in order).
  int64_t recv_offset(int i, int j) const {
    int64_t o = 0;
    for (int s = 0; s < i; ++s) o += send(s, j);
    return o;
  }
};

// Same on every rank given the same matrix. Throws when the backend trusts no lowering.
Lowering choose_lowering(std::span<const int64_t> split, const Capabilities& caps);

// The plan of an agreed split matrix [W, W] (total and max_split filled in).
Plan agreed_plan(int world, std::vector<int64_t> split, bool all_x_in_place);

// Collective: one all_gather of this rank's send counts [W], whether its input is valid and
// whether its x is in place (Group::expose_staging), so neither agreement costs a collective of
// its own; returns the agreed plan (split left empty where a rank's input was invalid).
Plan make_plan(Group& group, std::span<const int64_t> send_counts, bool input_valid,
               bool x_in_place = false);

// Reusable staging for the padded lowering.
struct Scratch {
  std::vector<std::byte> send, recv;
};

// Collective: moves records of rec_bytes. send holds send_counts[j] records for rank j, packed in
// rank order; recv receives recv_counts[i] records from rank i, packed in rank order. `padded`
// pads every block to pad_records.
void exchange(Group& group, Lowering lowering, int64_t pad_records,
              std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
              const std::byte* send, std::byte* recv, size_t rec_bytes, Scratch& scratch,
              EpCallStats& stats);

}  // namespace deepinfer::ep::a2a
