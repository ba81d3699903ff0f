// The DeepSeek-V3 / V2 architecture (docs/numerics.md, docs/architecture.md §6;
// tools/reference/NUMERICS.md pins every rounding point): embeddings, MLA over the paged latent
// cache (absorbed form), dense SwiGLU FFN, MoE (router -> EPBuffer dispatch in the expand layout
// -> expert GEMMs -> SwiGLU -> exact combine, plus the shared expert), final norm, fp32 logits.
//
// One DeepseekModel per rank. A forward call takes this rank's batch of sequences (possibly
// none); every rank must call forward() the same number of times, because each MoE layer is a
// collective over the group.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/engram.h>
#include <deepinfer/ep.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/weights.h"

namespace deepinfer::model {

struct ModelOptions {
  int64_t max_tokens_per_step = 512;  // tokens one rank feeds per forward (EPBuffer M)
  // The MoE layers' EPBuffer policy: algo, combine, ag_rows, reduce, chunk_bytes, peer_memory (the
  // model sets the shape fields from the checkpoint and M from max_tokens_per_step).
  EPConfig ep;
  // The Engram tables' fetch lowering (EngramBuffer; auto picks from the group).
  EngramAlgo engram_algo = EngramAlgo::automatic;
  // Evidence knobs (check e2e --ablate): Engram rows fetched as zeros (the tables zeroed), and
  // every mHC comb replaced by the identity. Never for serving.
  bool ablate_engram = false;
  bool ablate_comb = false;
  // Several ranks with few rows in all (DEEPINFER_EP_SPLIT, docs/ep.md §14): the ranks share the
  // replicated fp8 work (the attention projections split by output columns, a MoE layer's shared
  // expert on one rank for every rank's rows: shared_expert_rank) instead of each running it on
  // its own rows. The same bytes either way.
  bool split_replicated = true;

  // The defaults with `ep` from the DEEPINFER_EP_* knobs (EPConfig::from_knobs).
  static ModelOptions from_knobs();
};

// Which rank runs a MoE layer's shared expert on every rank's rows, or -1 for each rank on its own
// (docs/ep.md §14). rows[q]: rank q's token count; topk_ids: every rank's rows' routed experts in
// rank order ([Σ rows, K], -1 = masked), expert e on rank e / (num_experts / W). A rank's cost is
// one weight read per distinct local expert (decode reads every touched expert once) plus
// kSharedRowCost per row it runs; the shared expert counts as an expert. The rank with the least
// routed cost takes it when the busiest rank's cost is then no higher than with every rank running
// its own (ties: the lowest rank); with one rank, or no rows, -1.
inline constexpr double kSharedRowCost = 0.25;
int shared_expert_rank(std::span<const int32_t> topk_ids, std::span<const int64_t> rows,
                       int64_t num_experts, int64_t top_k);

// One sequence's slice of a forward call: `num_tokens` new tokens at positions
// [start_pos, start_pos + num_tokens); the cache already holds positions < start_pos.
struct SeqChunk {
  int64_t cache_seq = 0;            // PagedKvCache sequence id
  const int32_t* tokens = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  int64_t start_pos = 0;
  bool all_logits = false;  // logits for every new position (else only the last)
};

// Routing decisions of one forward call, per MoE layer, for every token of the batch.
struct RoutingTrace {
  std::vector<int64_t> layers;              // MoE layer indices
  std::vector<std::vector<int64_t>> topk;   // per MoE layer [T, K] expert ids in slot order
  std::vector<std::vector<float>> margins;  // per MoE layer [T] selection margins
  std::vector<int> shared_rank;  // per MoE layer: the rank that ran the shared expert for every
                                 // rank's rows, or -1 (each its own: shared_expert_rank)
};

struct ForwardOutput {
  Tensor logits;                   // [R, V] f32: per chunk, all its positions or its last
  std::vector<int64_t> row_begin;  // [chunks + 1] row range of each chunk in logits
  RoutingTrace routing;            // filled when forward(..., trace = true)
  // forward(..., hidden = true): [T, hidden] bf16, every new token in chunk order, before the
  // final norm (what the MTP module reads). mtp_forward: [R, hidden], the block output of each
  // logits row (what the chain reads).
  Tensor hidden;
};

// The weight bytes a decode step reads, split by what the batch changes: weights every step reads
// once (attention, dense FFNs, routers, shared experts, norms, LM head), one routed expert's MLP
// (read once per distinct expert the batch routes to in a layer), and the embedding row per token.
struct DecodeWeightBytes {
  double shared = 0;
  double routed_expert = 0;
  double per_token = 0;
  int64_t moe_layers = 0;
  // A step of `tokens` tokens that touches `distinct_experts` (layer, expert) pairs in total.
  double step_bytes(int64_t tokens, double distinct_experts) const {
    return shared + distinct_experts * routed_expert + double(tokens) * per_token;
  }
};

class DeepseekModel {
 public:
  DeepseekModel(std::shared_ptr<const ModelWeights> weights, Group& group,
                const ModelOptions& opts);
  ~DeepseekModel();
  DeepseekModel(const DeepseekModel&) = delete;
  DeepseekModel& operator=(const DeepseekModel&) = delete;

  const ModelConfig& config() const;
  const ModelWeights& weights() const;
  // The cache geometry this model needs (num_pages chosen by the caller).
  KvCacheConfig kv_cache_config(int64_t num_pages) const;
  // Collective (MoE layers). Total new tokens must be <= max_tokens_per_step. The cache must have
  // room reserved for every chunk (forward reserves it).
  ForwardOutput forward(const std::vector<SeqChunk>& chunks, PagedKvCache& cache,
                        bool trace = false, bool hidden = false);
  // True when the weights hold an MTP module (LoadOptions::mtp); the cache then has one more layer.
  bool has_mtp() const;
  // Collective, like forward: the MTP module (docs/architecture.md §6.1). Chunk
  // token j at position p = start_pos + j is the token at p + 1, `hidden` row [T, hidden] the
  // state for position p (the main model's before its final norm, or the previous MTP step's
  // block output); the logits predict the token at p + 2, and out.hidden is the block output of
  // each logits row. A chunk without all_logits runs only its last row past the cache write: its
  // earlier rows (a speculative step's catch-up) are read by later positions' attention only.
  // The module's latent rows go to the cache's last layer at position p. draft_vocab > 0: logits
  // [R, draft_vocab] of the first draft_vocab ids only (the head reads only their rows).
  ForwardOutput mtp_forward(const std::vector<SeqChunk>& chunks, const bf16* hidden,
                            PagedKvCache& cache, int64_t draft_vocab = 0);
  // Bytes of weights one token reads in decode (attention + dense + top-k experts + shared + head),
  // for the decode roofline.
  double active_weight_bytes_per_token() const;
  // The same bytes split for a batch (bench decode --batch).
  DecodeWeightBytes decode_weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::model
