// comm: one rank's handle on a process group (docs/architecture.md §3). Every collective is
// blocking, has a deadline (DEEPINFER_COMM_TIMEOUT_S) and throws CommTimeout naming op, rank, size
// and bytes when it expires. Buffers are laid out contiguously in rank order.
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/error.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace deepinfer {

enum class ReduceOp : uint8_t { sum, max, min };

// Which lowerings of all_to_all a backend trusts. EPBuffer's `auto` algorithm and the a2a
// lowering choice read these; a user overrides them with DEEPINFER_CAPABILITIES=FILE
// (written by `deepinfer check collectives --save-capabilities FILE`).
struct Capabilities {
  bool all_to_all = true;    // even splits
  bool all_to_all_v = true;  // uneven splits
  // reduce_scatter adds in ascending rank order (bit-reproducible `fast` combine).
  bool ordered_reduce = true;
};

// How ranks of a group can read each other's memory (Group::expose).
enum class PeerMemory : uint8_t {
  none,           // they cannot: everything moves through collectives
  window,         // exposed bytes are copied into a shared window (mpi, every rank on one host)
  address_space,  // one process: exposed bytes are read where they are, nothing copied (local)
};

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "faulty(<fault>)/<inner>"
  virtual Capabilities capabilities() const = 0;

  // Non-reducing ops move bytes; `dtype` only says how many bytes an element has (and lets
  // fault injection model type-dependent bugs). recv holds size() blocks of `count` elements;
  // all_gather's send may be recv's block of this rank (in place: that block is not copied).
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv_counts[r] elements from rank r, packed back to back in rank order.
  virtual void all_gather_v(const void* send, size_t send_count, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) = 0;
  // In place. dtype in {f32, f64, i32, i64}.
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // send: size() blocks of `count` f32; recv[i] = sum over ranks of their block rank(),
  // added in ascending rank order where capabilities().ordered_reduce.
  virtual void reduce_scatter(const float* send, float* recv, size_t count) = 0;
  // Equal splits: block r of send goes to rank r; block r of recv came from rank r.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send_counts[r] elements to rank r, recv_counts[r] from rank r, packed in rank order.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) = 0;
  // all_to_all_v whose send side is a gather of fixed-size rows rather than one packed buffer:
  // rank r gets rows[offsets[r] .. offsets[r + 1]) of `base` (row i at base + i · row_bytes), in
  // that order; recv_rows[r] rows come from rank r, packed in rank order. Byte for byte the same
  // exchange as all_to_all_v of the packed rows, so ranks may mix the two calls. Backends that
  // can send from the rows skip the pack copy (local: peers copy out of base; mpi: an indexed
  // datatype). The default packs and calls all_to_all_v.
  virtual void all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                                 std::span<const int64_t> offsets, void* recv,
                                 std::span<const size_t> recv_rows);
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  // Whether (and how) every rank can read every other rank's memory; the same answer on every
  // rank. Wrappers that inject faults say none, so nothing goes around the collectives they
  // break. EPBuffer's a2a direct lowerings read (and, in one address space, write) their peers'
  // buffers this way (docs/ep.md).
  virtual PeerMemory peer_memory() const { return PeerMemory::none; }
  // Collective, where peer_memory() != none: every rank exposes the same number of regions, and
  // gets peers[r · regions.size() + i] = where rank r's region i is readable (local: r's pointer;
  // mpi: r's copy in the shared window). They stay readable and unchanged (peers only read them)
  // until the ranks' next barrier(), also when a collective fails first (docs/architecture.md §3);
  // a rank whose collective threw must not touch them any more. Elsewhere it throws.
  virtual void expose(std::span<const std::span<const std::byte>> regions,
                      std::vector<const std::byte*>& peers);
  // Collective, like expose, for regions the peers write into: peers[r · regions.size() + i] =
  // where this rank may write rank r's region i. Every peer write has reached the region itself
  // once the ranks' next barrier() returns (local: the region is written where it is; mpi: its
  // copy in the shared window is, copied back at that barrier). Bytes no peer writes keep their
  // values; the owner leaves the regions alone until that barrier. The default serves groups in
  // one address space (it gathers the regions' addresses) and throws elsewhere.
  virtual void expose_writable(std::span<const std::span<std::byte>> regions,
                               std::vector<std::byte*>& peers);
  // Where this rank may build the first region of its next expose so that expose finds it in
  // place and copies nothing: `bytes` at the start of its slot of the shared window (mpi). nullptr
  // where there is no such place: exposing copies nothing anyway (local), the window is not (yet)
  // that large (the next expose grows it), or there is no peer memory. Local, no collective. The
  // bytes stay valid until the expose that reads them returns.
  virtual std::byte* expose_staging(size_t bytes) { return nullptr; }
};

enum class CommKind : uint8_t { local, mpi };
std::string_view to_string(CommKind);  // "local", "mpi"
// The DEEPINFER_COMM knob (read once per process; an invalid value throws, naming it).
CommKind comm_kind_from_knobs();

struct LaunchOptions {
  CommKind comm = CommKind::local;
  int world = 1;         // local: number of rank threads; mpi: checked against the launcher
  std::string fault;     // empty, or a fault name for the `faulty` wrapper
  double timeout_s = 0;  // 0 = DEEPINFER_COMM_TIMEOUT_S
  std::string world_option = "--world";  // how the caller's user sets `world`, for messages
};

// Runs fn(group) on every rank: `world` threads for local, this process for mpi (MPI is
// initialised and finalised here). If any rank throws, the first error is rethrown after
// every rank has returned or timed out — nothing is left hanging.
void run_ranks(const LaunchOptions& opts, const std::function<void(Group&)>& fn);

// Names the faults `faulty` can inject, with one line of description each.
std::span<const std::pair<std::string_view, std::string_view>> fault_names();

}  // namespace deepinfer
