#include "comm/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/env.h"

namespace deepinfer::comm {

std::string_view op_name(OpKind op) {
  switch (op) {
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::all_gather_v:
      return "all_gather_v";
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::all_to_all:
      return "all_to_all";
    case OpKind::all_to_all_v:
      return "all_to_all_v";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::barrier:
      return "barrier";
  }
  return "?";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::string describe(const CallDesc& d) {
  switch (d.op) {
    case OpKind::barrier:
      return "barrier()";
    case OpKind::all_gather_v:
    case OpKind::all_to_all_v:
      return fmt::format("{}({})", op_name(d.op), dtype_name(d.dtype));
    case OpKind::all_reduce:
      return fmt::format("all_reduce(count {}, {}, {})", d.count, dtype_name(d.dtype),
                         reduce_op_name(d.reduce));
    case OpKind::broadcast:
      return fmt::format("broadcast(count {}, {}, root {})", d.count, dtype_name(d.dtype), d.root);
    default:
      return fmt::format("{}(count {}, {})", op_name(d.op), d.count, dtype_name(d.dtype));
  }
}

std::string timeout_message(std::string_view op, double timeout_s, int rank, int size,
                            size_t bytes) {
  return fmt::format(
      "{} timed out after {:.1f} s on rank {} of {} ({} bytes sent); a peer hung or died — check "
      "the other ranks' errors, or raise DEEPINFER_COMM_TIMEOUT_S",
      op, timeout_s, rank, size, bytes);
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double resolve_timeout(double launch_timeout_s) {
  return launch_timeout_s > 0 ? launch_timeout_s : knobs().comm_timeout_s;
}

}  // namespace deepinfer::comm

namespace deepinfer {
namespace comm {
void check_rows_args(size_t world, size_t offsets, size_t recv_rows) {
  DI_CHECK(offsets == world + 1 && recv_rows == world,
           "all_to_all_v_rows: {} offsets and {} recv_rows for a world of {} (want {} and {})",
           offsets, recv_rows, world, world + 1, world);
}
}  // namespace comm

void Group::expose(std::span<const std::span<const std::byte>>, std::vector<const std::byte*>&) {
  DI_FAIL("expose: the {} backend has no peer memory (check Group::peer_memory() first)",
          backend());
}

void Group::expose_writable(std::span<const std::span<std::byte>> regions,
                            std::vector<std::byte*>& peers) {
  DI_CHECK(peer_memory() == PeerMemory::address_space,
           "expose_writable: the {} backend has no writable peer memory here (check "
           "Group::peer_memory() first)",
           backend());
  // One address space: a region's own address is where every peer writes it.
  std::vector<std::byte*> mine(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) mine[i] = regions[i].data();
  peers.assign(regions.size() * size_t(size()), nullptr);
  all_gather(mine.data(), peers.data(), mine.size() * sizeof(std::byte*), DType::u8);
}

// Group::all_to_all_v_rows for backends that cannot send from rows: pack, then all_to_all_v.
void Group::all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                              std::span<const int64_t> offsets, void* recv,
                              std::span<const size_t> recv_rows) {
  const size_t n = size_t(size());
  comm::check_rows_args(n, offsets.size(), recv_rows.size());
  thread_local std::vector<std::byte> packed;  // reused: a fresh big buffer faults on every page
  packed.resize(std::max<size_t>(1, size_t(offsets[n]) * row_bytes));
  const auto* src = static_cast<const std::byte*>(base);
  for (int64_t i = 0; i < offsets[n]; ++i)
    std::memcpy(packed.data() + size_t(i) * row_bytes, src + size_t(rows[size_t(i)]) * row_bytes,
                row_bytes);
  std::vector<size_t> sc(n), rc(n);
  for (size_t r = 0; r < n; ++r) {
    sc[r] = size_t(offsets[r + 1] - offsets[r]) * row_bytes;
    rc[r] = recv_rows[r] * row_bytes;
  }
  all_to_all_v(packed.data(), sc, recv, rc, DType::u8);
}

}  // namespace deepinfer
