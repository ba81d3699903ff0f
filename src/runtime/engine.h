// The engine (docs/architecture.md §6): prefill + decode with the paged latent cache, batches of
// sequences, sampling, stop tokens and a streaming callback. Data-parallel attention: each rank
// runs its own requests (possibly none) and every rank steps together, so every rank joins every
// MoE layer.
//
// Two ways in. The step-level API (start / cancel / step) lets requests join and leave between
// steps; a caller that plans for every rank (the server's scheduler) calls step() on every rank
// the same number of times. generate() is the batch form built on it: it starts requests as the
// page pool and max_batch allow and steps until no rank has work (one small MAX all_reduce per
// step).
#pragma once

#include <deepinfer/comm.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek.h"

namespace deepinfer::runtime {

struct SamplingConfig {
  float temperature = 0.0f;  // >= 0; 0: greedy
  int32_t top_k = 0;         // >= 0; 0: no top-k filter
  float top_p = 1.0f;        // in (0, 1]; 1: no top-p filter
  uint64_t seed = 0;
};

struct Request {
  int64_t id = 0;               // the caller's index (e.g. the prompt's line)
  std::vector<int32_t> prompt;  // token ids (BOS included if the model wants one)
  int64_t max_new_tokens = 64;
  SamplingConfig sampling;
  std::vector<int32_t> stop_ids;  // generation ends after one of these (kept in the output)
  bool record = false;            // keep every position's logits and routing (check e2e)
};

struct RequestResult {
  int64_t id = 0;
  std::vector<int32_t> tokens;                // generated ids
  std::string finish_reason;                  // "stop" | "length"
  int64_t num_positions = 0;                  // record: prompt + generated - 1 positions
  std::vector<float> logits;                  // record: [num_positions, V] f32
  std::vector<int64_t> moe_layers;            // record: MoE layer indices
  std::vector<std::vector<int64_t>> routing;  // record: per MoE layer [num_positions, K]
  float min_router_margin = 0;  // record: smallest router selection margin seen (+inf if none)
  // record with speculation: the MTP module's logits at every position p < num_positions (it
  // reads the main model's state at p and the token at p + 1, and predicts the token at p + 2).
  std::vector<float> mtp_logits;    // [num_positions, V] f32
  std::vector<int32_t> drafts;      // record with speculation: each decode step's drafts, in order
  std::vector<int64_t> spec_steps;  // record with speculation: [steps, 2] drafts, accepted
};

// Called on the rank that owns the request, once per generated token.
using TokenCallback = std::function<void(int64_t id, int32_t token)>;

struct EngineOptions {
  int64_t max_tokens_per_step = 256;  // new tokens per forward on one rank (prefill is chunked)
  int64_t max_batch = 64;             // sequences in flight per rank
  // KV pages per rank (64 tokens each). 0: generate() sizes a pool for each call's requests;
  // the step-level API needs a fixed pool (> 0).
  int64_t kv_pages = 0;
  model::ModelOptions model;  // EP policy (ModelOptions::from_knobs() for the knobs');
                              // max_tokens_per_step is copied in
  // > 0: self-speculative decoding (docs/architecture.md §6.1) with this many MTP drafts per
  // sequence and step; the weights need an MTP module (LoadOptions::mtp). 0: plain decode.
  int64_t draft_tokens = 0;
  // > 0: the MTP head scores only the first draft_vocab token ids (drafts come from them; the
  // main model still verifies over the whole vocabulary, so the output is the same). The head is
  // most of a draft's weight reads on a large vocabulary (docs/architecture.md §6.1). 0: all.
  int64_t draft_vocab = 0;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  double prefill_seconds = 0;  // steps that held any prefill chunk
  double decode_seconds = 0;   // steps of decode tokens only (their MTP forwards included)
  int64_t decode_emitted = 0;  // tokens the decode steps generated (> steps with speculation)
  int64_t drafted = 0;         // speculation: MTP drafts verified
  int64_t accepted = 0;        // speculation: drafts the main model agreed with
  double draft_seconds = 0;    // speculation: the MTP forwards (in the steps' seconds above)
};

// What one step did for one of this rank's sequences: a generated token, and the whole result
// when the sequence ended with it. With speculation a step can generate several tokens of one
// sequence: one event each, in order.
struct StepEvent {
  int64_t id = 0;
  int32_t token = -1;
  bool finished = false;
  RequestResult result;  // finished: tokens, finish_reason and the record fields
};

// KV pages a request reserves when it starts: room for its prompt and max_new_tokens.
int64_t pages_needed(const Request& r);

class Engine {
 public:
  Engine(std::shared_ptr<const model::ModelWeights> weights, Group& group,
         const EngineOptions& opts);
  ~Engine();

  // ---- step-level API (this rank's sequences; no collective except step) ----
  int64_t total_pages() const;  // 0 until a pool exists
  int64_t free_pages() const;
  int64_t num_active() const;  // sequences started and not finished or cancelled
  // Starts `r` on this rank at the next step and reserves its pages now. Errors (nothing
  // changes): a request_problem, an id already active, max_batch sequences already in flight, or
  // not enough free pages (check pages_needed(r) <= free_pages()).
  void start(Request r);
  // Ends sequence `id` now and frees its pages; no event follows. Unknown ids are ignored (it
  // may have finished in the step that just ran).
  void cancel(int64_t id);
  // Collective: one forward on every rank, each over its own sequences (possibly none; a rank
  // with none still joins every MoE layer). Decode tokens first, then prefill chunks in the
  // rest of max_tokens_per_step. Finished sequences free their pages before it returns.
  std::vector<StepEvent> step();

  // Collective: every rank calls it (with its own requests, possibly none) and it returns when
  // all ranks are done. Results are this rank's requests, in request order. The requests are
  // checked (request_problem) before the first step and the ranks agree on the outcome: one bad
  // request on any rank is the same Error on every rank, and no rank is left waiting.
  std::vector<RequestResult> generate(const std::vector<Request>& requests,
                                      const TokenCallback& on_token = {});

  model::DeepseekModel& model();
  const EngineStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every rank's results, on every rank, sorted by id (collective; moves bytes with all_gather_v).
std::vector<RequestResult> gather_results(Group& group, const std::vector<RequestResult>& local);

}  // namespace deepinfer::runtime
