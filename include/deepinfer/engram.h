// engram: EngramBuffer, row fetch from a table sharded across the ranks of any Group
// (docs/ep.md §12). Mirrors DeepEP's Engram fetch: every rank holds n rows of width H; global row
// g lives on rank g / n at row g % n; fetch(indices [T, J] or [L, T, J]) returns data [T, J·H] (and
// fp8 scale factors [T, J·P]); index -1 gives a zero row. Three lowerings (all_gather,
// all_to_all_v, direct reads of the owner's shard) give the same bytes.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <memory>
#include <string_view>

namespace deepinfer {

enum class EngramDType : uint8_t { bf16, fp8 };  // fp8 = e4m3 rows + P fp32 scale factors per row

// How a fetch moves rows: indices by all_gather and rows by all_gather_v (no all_to_all), ids and
// rows by all_to_all_v, direct reads of the owners' shards (peer memory), or chosen from the
// group (direct in one address space, else a2a where all_to_all_v is trusted, else ag).
enum class EngramAlgo : uint8_t { ag, a2a, direct, automatic };
std::string_view to_string(EngramAlgo);  // "ag", "a2a", "direct", "auto"

struct EngramConfig {
  int hidden = 0;  // H, elements per row
  EngramDType dtype = EngramDType::bf16;
  int scale_cols = 0;  // P, fp32 scale factors per row (fp8 only; 0 for bf16)
  EngramAlgo algo = EngramAlgo::automatic;
};

struct EngramResult {
  Tensor data;  // [T, J·H] ([L, T, J·H]) bf16 or e4m3: token t's J rows side by side
  Tensor sf;    // [T, J·P] ([L, T, J·P]) f32 (fp8 only)
};

// A started fetch. The fetch is eager: start_fetch runs the whole exchange, so wait() returns at
// once and handles may be waited on in any order, or dropped.
class EngramFetch {
 public:
  EngramFetch() = default;
  explicit EngramFetch(EngramResult r) : result_(std::move(r)), valid_(true) {}
  bool valid() const { return valid_; }
  // The result (each handle gives it once; a second wait is an Error).
  EngramResult wait();

 private:
  EngramResult result_;
  bool valid_ = false;
};

class EngramBuffer {
 public:
  // Collective: one small all_reduce checks that H, dtype, P and the algorithm agree on all ranks
  // (Error on every rank otherwise). The group must outlive the buffer.
  EngramBuffer(Group& group, const EngramConfig& config);
  ~EngramBuffer();
  EngramBuffer(const EngramBuffer&) = delete;
  EngramBuffer& operator=(const EngramBuffer&) = delete;

  // Collective: this rank's shard, storage [n, H] (bf16 or e4m3) and, for fp8, sf [n, P] f32.
  // The rows are copied in. n >= 1 and the same on every rank; a bad shard or a differing n is an
  // Error on every rank.
  void write(const Tensor& storage, const Tensor& sf = {});

  // Collective. indices [T, J] i32 (T may differ per rank and be 0), each in [-1, W·n), or
  // [L, T, J] for L layers in one exchange (their rows are ranges of the one table). An index
  // out of range on any rank is an Error on every rank, agreed before any row moves. Returns
  // fresh tensors (they do not alias the buffer).
  EngramFetch start_fetch(const Tensor& indices);
  EngramResult fetch(const Tensor& indices) { return start_fetch(indices).wait(); }

  const EngramConfig& config() const;
  int64_t rows_per_rank() const;  // n (0 before the first write)
  EngramAlgo path() const;        // the resolved lowering (never automatic)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
