// ep: EPBuffer, MoE dispatch/combine over any Group (docs/ep.md). Mirrors DeepEP's EPBuffer
// semantics (deterministic mode) on plain collectives, with an all_to_all-free algorithm (ag)
// and an all_to_all one (a2a) that produce identical results.
//
// Conventions: W ranks, E experts, L = E / W local experts; expert e lives on rank e / L with
// local id e - rank·L. topk_idx is int64 [T, K], -1 = masked. gid = src_rank·M + src_token.
//
// Choices where DeepEP leaves room (documented here, tested by `deepinfer check ep`):
// - recv_topk_weights carries all K source weights unchanged (DeepEP V2), masked and non-local
//   slots included; recv_topk_idx is the local expert id or -1.
// - combine weights the expert outputs by the routing weights. Non-expand: y[i] is row i's
//   output and is used for every local slot of the row (Σ_local w_k·y[i]); per-expert outputs
//   need the expand layout, where y[s] is expanded row s's output.
// - Combined weights: the weight of each unmasked slot as returned by its expert's rank, 0 for
//   masked slots; -0 is returned as +0 (the canonicalisation that makes exact combine exact).
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

// The dispatch/combine algorithm: all-gather, all-to-all, or chosen from the group's capabilities.
enum class EpAlgo : uint8_t { ag, a2a, automatic };
// ag's dispatch row count: the max over ranks, or the fixed capacity M.
enum class AgRows : uint8_t { max, cap };
// ag's combine collective: reduce-scatter or all-reduce.
enum class EpReduce : uint8_t { rs, ar };
// exact = bit-identical to a single rank; fast = the backend's reduction order.
enum class CombineMode : uint8_t { exact, fast };
// a2a's direct lowering (peer memory): never, always, or where the call moves enough bytes.
enum class EpPeerMemory : uint8_t { off, on, automatic };

// The words of the DEEPINFER_EP_* knobs ("auto" for automatic).
std::string_view to_string(EpAlgo);
std::string_view to_string(AgRows);
std::string_view to_string(EpReduce);
std::string_view to_string(CombineMode);
std::string_view to_string(EpPeerMemory);

enum class DispatchDType : uint8_t { bf16, fp8 };  // fp8 = e4m3 + fp32 scales [T, ceil(H/128)]

constexpr int kEpScaleBlock = 128;  // channels per fp8 activation scale (1×128)
constexpr int kEpMaxTopk = 32;      // DeepEP's limit on K
constexpr size_t kEpDirectMinBytes = size_t(256) << 10;  // EPConfig::peer_memory = automatic
constexpr int kEpMaxLocalExperts = 1024;

// EPBuffer configuration. The algorithm/combine fields default to the DEEPINFER_EP_* knobs'
// defaults; from_knobs() takes them from the process environment instead. validate() names the
// bad field.
struct EPConfig {
  int num_experts = 0;              // E, E % W == 0
  int hidden = 0;                   // H
  int num_topk = 0;                 // K, 1..32, K <= E
  int num_max_tokens_per_rank = 0;  // M, identical on all ranks (checked at construction)
  DispatchDType dispatch_dtype = DispatchDType::bf16;
  int expert_alignment = 1;  // per-expert segment alignment (counts and expand layout)
  bool expand = false;       // one received row per (token, local expert), grouped-GEMM layout
  EpAlgo algo = EpAlgo::automatic;           // DEEPINFER_EP_ALGO
  CombineMode combine = CombineMode::exact;  // DEEPINFER_EP_COMBINE
  AgRows ag_rows = AgRows::max;              // DEEPINFER_EP_AG_ROWS
  EpReduce reduce = EpReduce::rs;            // DEEPINFER_EP_REDUCE
  // Largest temporary of one ag combine collective; a chunk holds at least one token row per
  // rank, so W·cols·4 bytes (cols = K·H + K exact, H + K fast) is the floor.
  size_t chunk_bytes = size_t(64) << 20;  // DEEPINFER_EP_CHUNK_BYTES
  // a2a on a group with peer memory (Group::peer_memory): combine reads the peers' expert
  // outputs in place and, where the ranks share one address space, dispatch reads received rows
  // where their sources hold them (the "direct" lowering); else records and partials go through
  // the exchange. Same bits either way. `automatic`: direct once a call moves kEpDirectMinBytes
  // per rank on average (below, the exchange's fewer collective rounds win: a decode step).
  EpPeerMemory peer_memory = EpPeerMemory::automatic;  // DEEPINFER_EP_PEER_MEMORY

  // The defaults with algo, combine, ag_rows, reduce, chunk_bytes and peer_memory from the
  // DEEPINFER_EP_* knobs (read once per process; an invalid one throws, naming it).
  static EPConfig from_knobs();

  int scale_cols() const {
    return dispatch_dtype == DispatchDType::fp8 ? (hidden + kEpScaleBlock - 1) / kEpScaleBlock : 0;
  }
  // Throws Error naming the field. world = group size.
  void validate(int world) const;
  std::string describe() const;
};

// layout(): purely local routing statistics.
struct Layout {
  std::vector<int64_t> num_tokens_per_rank;    // [W]: tokens with >= 1 unmasked expert on rank r
  std::vector<int64_t> num_tokens_per_expert;  // [E]: (t, k) pairs routed to e
  std::vector<uint8_t> is_token_in_rank;       // [T, W] row-major, 0/1
};

struct DispatchInput {
  Tensor x;             // [T, H] bf16, or e4m3 when dispatch_dtype = fp8
  Tensor scales;        // [T, ceil(H/128)] f32, fp8 only
  Tensor topk_idx;      // [T, K] i64, -1 = masked
  Tensor topk_weights;  // [T, K] f32
};

namespace ep {
struct HandleData;  // src/ep/handle.h
}

// What a dispatch learned about routing; reused by cached dispatch and by combine.
struct Handle {
  std::shared_ptr<const ep::HandleData> data;
  bool valid() const { return data != nullptr; }
};

// N = received rows (one per (source token, this rank)); S = expanded rows = Σ aligned counts.
struct DispatchOutput {
  Tensor x;         // [N, H] or expand [S, H], input dtype; expand padding rows zero
  Tensor scales;    // [N or S, P] f32 (fp8 only); expand padding zero
  Tensor topk_idx;  // [N, K] i64 local expert id or -1; expand: [S] i64 local expert, -1 padding
  Tensor topk_weights;  // [N, K] f32 all source weights; expand: [S] f32 the row's slot weight, 0
                        // padding
  Tensor src;           // [N] i64 gid; expand: [S] i64 gid, -1 padding
  Tensor expand_row;    // expand only: [S] i64 index of the received row (0..N-1), -1 padding
  int64_t num_recv_tokens = 0;                              // N
  std::vector<int64_t> num_recv_tokens_per_rank;            // [W] rows from each source rank
  std::vector<int64_t> num_recv_tokens_per_expert;          // [L] raw counts
  std::vector<int64_t> num_recv_tokens_per_expert_aligned;  // [L] aligned to expert_alignment
  Handle handle;
};

struct CombineOutput {
  Tensor x;             // [T, H] bf16
  Tensor topk_weights;  // [T, K] f32
};

// Bytes this rank handed to data collectives in the last call (for benchmarks).
struct EpCallStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_recv = 0;
  int collectives = 0;
  std::string lowering;  // "ag", or a2a's "even" / "v" / "padded"
};

class EPBuffer {
 public:
  // Collective: one small all_reduce checks that E, H, K, M, dtype and algorithm agree on all
  // ranks. The group must outlive the buffer.
  EPBuffer(Group& group, const EPConfig& config);
  ~EPBuffer();
  EPBuffer(const EPBuffer&) = delete;
  EPBuffer& operator=(const EPBuffer&) = delete;

  // Local (no communication). Throws on ids out of range or repeated within a row.
  Layout layout(const Tensor& topk_idx) const;

  // Collective. Invalid input on any rank throws Error on every rank (agreed by one all_reduce
  // before any data moves). Rows come out in (source rank, source token) order.
  DispatchOutput dispatch(const DispatchInput& in);
  // Cached: reuses handle's routing (weights and ids from the original dispatch), no count
  // collective; bit-identical to the uncached result for the same x. Shape errors are local.
  DispatchOutput dispatch(const Tensor& x, const Tensor& scales, const Handle& handle);

  // Collective. y: [N, H] bf16 (non-expand) or [S, H] bf16 (expand). Returns the per-token
  // routing-weighted sum (exact or fast, docs/ep.md §5) and the combined weights.
  CombineOutput combine(const Tensor& y, const Handle& handle);
  // Input places. dispatch_input and combine_input hand out places the EPBuffer reuses: where
  // the group has a shared window (a2a on mpi, one host) views of this rank's part of it, which
  // dispatch and combine then expose without a copy; else buffers of this EPBuffer. Each tensor
  // they return, and every copy of it (DispatchInput::x included), is counted, and the EPBuffer
  // holds the rules, so code that breaks them fails on every backend, not only where the bytes
  // are shared:
  // - x (dispatch_input) lives through its dispatch (and any number of dispatches) and may be read
  //   after it, e.g. by the shared experts; combine_input, combine and the next dispatch_input
  //   reuse its place, so they throw Error while any x tensor is alive. Read x, then drop it.
  // - y (combine_input) lives through its combine (and may be combined again); dispatch,
  //   dispatch_input and the next combine_input reuse its place, so they throw Error while any
  //   y tensor is alive. Drop y once its combine has returned.
  // Raw pointers taken from these tensors are outside the count: they are valid while the tensor
  // is. The count covers this EPBuffer's own calls; another user of the group's window (a second
  // EPBuffer on the same group, a direct Group::expose) reuses the same bytes.
  //
  // Local. Where to write the expert outputs for combine(y, handle): [N, H] or [S, H] bf16,
  // contents undefined. Where combine reads the peers' y in place (a2a direct), a window view, so
  // combine copies nothing there (an ordinary tensor as y is copied in first).
  Tensor combine_input(const Handle& handle);
  // Local. Where to write x for dispatch: [T, H] in the dispatch dtype, contents undefined. On a2a
  // over a shared window a view of this rank's part of it (with room for all that dispatch
  // exposes): when every rank's x is there, dispatch has the peers read the rows in place (the
  // direct lowering) instead of exchanging them.
  Tensor dispatch_input(int64_t num_tokens);

  const EPConfig& config() const;
  int world_size() const;
  EpAlgo algorithm() const;  // resolved: ag or a2a (never automatic)
  const EpCallStats& last_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Resolves `auto` from the group's capabilities: a2a where the backend trusts all_to_all_v, ag
// (no all_to_all at all) where it does not. At every W a2a moves no more bytes than ag (dispatch:
// T·min(W, K) rows against W·R; combine: bf16 partials, or per-slot rows, against ag's fp32
// reduce_scatter of W·R rows) and measured faster (docs/performance.md §3.1).
EpAlgo resolve_ep_algo(EpAlgo requested, const Capabilities& caps);

}  // namespace deepinfer
