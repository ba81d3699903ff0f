#include "ep/alltoall/a2a.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace deepinfer::ep::a2a {

std::string_view to_string(Lowering l) {
  switch (l) {
    case Lowering::even:
      return "even";
    case Lowering::v:
      return "v";
    case Lowering::padded:
      return "padded";
  }
  return "?";
}

Lowering choose_lowering(std::span<const int64_t> split, const Capabilities& caps) {
  const bool all_equal = split.empty() || std::all_of(split.begin(), split.end(),
                                                      [&](int64_t v) { return v == split[0]; });
  if (all_equal && caps.all_to_all) return Lowering::even;
  if (caps.all_to_all_v) return Lowering::v;
  if (caps.all_to_all) return Lowering::padded;
  DI_FAIL(
      "ep a2a: the backend trusts neither all_to_all nor all_to_all_v (capabilities); use "
      "DEEPINFER_EP_ALGO=ag (or auto), which needs no all_to_all");
}

Plan make_plan(Group& group, std::span<const int64_t> send_counts, bool input_valid,
               bool x_in_place) {
  const int w = group.size();
  DI_CHECK(int(send_counts.size()) == w, "a2a plan: {} send counts for {} ranks",
           send_counts.size(), w);
  // One row per rank: [flags (bit 0: valid, bit 1: x in place), counts to rank 0 .. W-1].
  const size_t row = size_t(w) + 1;
  std::vector<int64_t> mine(row), all(row * size_t(w));
  mine[0] = int64_t(input_valid) | int64_t(x_in_place) << 1;
  std::copy(send_counts.begin(), send_counts.end(), mine.begin() + 1);
  group.all_gather(mine.data(), all.data(), row * 8, DType::u8);
  Plan p;
  p.world = w;
  p.split.assign(size_t(w) * size_t(w), 0);
  p.all_x_in_place = true;
  for (int r = w - 1; r >= 0; --r) {
    if (!(all[size_t(r) * row] & 1)) p.first_invalid_rank = r;
    p.all_x_in_place = p.all_x_in_place && (all[size_t(r) * row] & 2);
    std::copy_n(all.begin() + std::ptrdiff_t(size_t(r) * row + 1), w,
                p.split.begin() + std::ptrdiff_t(size_t(r) * size_t(w)));
  }
  if (p.first_invalid_rank >= 0) return p;
  return agreed_plan(w, std::move(p.split), p.all_x_in_place);
}

Plan agreed_plan(int world, std::vector<int64_t> split, bool all_x_in_place) {
  DI_CHECK(split.size() == size_t(world) * size_t(world),
           "a2a plan: a split matrix of {} for {} ranks", split.size(), world);
  Plan p;
  p.world = world;
  p.split = std::move(split);
  p.all_x_in_place = all_x_in_place;
  for (int64_t v : p.split) p.total += v;
  p.max_split = p.split.empty() ? 0 : *std::max_element(p.split.begin(), p.split.end());
  return p;
}

void exchange(Group& group, Lowering lowering, int64_t pad_records,
              std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
              const std::byte* send, std::byte* recv, size_t rec_bytes, Scratch& scratch,
              EpCallStats& stats) {
  const size_t w = size_t(group.size());
  uint64_t sent = 0, received = 0;
  for (size_t r = 0; r < w; ++r) {
    sent += uint64_t(send_counts[r]) * rec_bytes;
    received += uint64_t(recv_counts[r]) * rec_bytes;
  }
  stats.collectives += 1;
  stats.lowering = std::string(to_string(lowering));
  switch (lowering) {
    case Lowering::even: {
      const size_t n = size_t(send_counts.empty() ? 0 : send_counts[0]);
      for (size_t r = 0; r < w; ++r)
        DI_CHECK(
            size_t(send_counts[r]) == n && size_t(recv_counts[r]) == n,
            "a2a even lowering with uneven counts (send {} recv {} to/from rank {}, expected {})",
            send_counts[r], recv_counts[r], r, n);
      group.all_to_all(send, recv, n * rec_bytes, DType::u8);
      break;
    }
    case Lowering::v: {
      std::vector<size_t> sc(w), rc(w);
      for (size_t r = 0; r < w; ++r) {
        sc[r] = size_t(send_counts[r]) * rec_bytes;
        rc[r] = size_t(recv_counts[r]) * rec_bytes;
      }
      group.all_to_all_v(send, sc, recv, rc, DType::u8);
      break;
    }
    case Lowering::padded: {
      const size_t block = size_t(pad_records) * rec_bytes;
      if (scratch.send.size() < w * block) scratch.send.resize(w * block);
      if (scratch.recv.size() < w * block) scratch.recv.resize(w * block);
      size_t off = 0;
      for (size_t r = 0; r < w; ++r) {
        const size_t n = size_t(send_counts[r]) * rec_bytes;
        DI_CHECK(send_counts[r] <= pad_records && recv_counts[r] <= pad_records,
                 "a2a padded lowering: {} / {} records exceed the pad {}", send_counts[r],
                 recv_counts[r], pad_records);
        if (n) std::memcpy(scratch.send.data() + r * block, send + off, n);
        off += n;
      }
      group.all_to_all(scratch.send.data(), scratch.recv.data(), block, DType::u8);
      off = 0;
      for (size_t r = 0; r < w; ++r) {
        const size_t n = size_t(recv_counts[r]) * rec_bytes;
        if (n) std::memcpy(recv + off, scratch.recv.data() + r * block, n);
        off += n;
      }
      sent = received = w * block;
      break;
    }
  }
  stats.bytes_sent += sent;
  stats.bytes_recv += received;
}

}  // namespace deepinfer::ep::a2a
