#include "runtime/engine.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>

#include "core/byte_io.h"
#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/sampling.h"
#include "runtime/requests.h"

namespace deepinfer::runtime {

namespace {

// One sequence in flight on this rank.
struct Seq {
  Request req;
  RequestResult res;
  int64_t cache_seq = 0;
  int64_t prefilled = 0;         // prompt tokens already in the cache
  std::vector<int32_t> pending;  // the decode input: the last generated token, then the drafts
  std::vector<int32_t> drafts;   // speculation: the MTP drafts for the next step
  std::vector<int32_t> mtp_in;   // speculation: the tokens the MTP module reads this step
  bool done = false;
  bool prefilling() const { return prefilled < int64_t(req.prompt.size()); }
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t pages_needed(const Request& r) {
  const int64_t len = int64_t(r.prompt.size()) + std::max<int64_t>(r.max_new_tokens, 0);
  return (len + kernels::kMlaPageSize - 1) / kernels::kMlaPageSize;
}

struct Engine::Impl {
  std::shared_ptr<const model::ModelWeights> weights;
  Group& group;
  EngineOptions opts;
  model::DeepseekModel model;
  EngineStats stats;
  std::unique_ptr<model::PagedKvCache> cache;
  std::vector<Seq> active;  // in start order

  // Collective: the options are checked on every rank and agreed before the model's EPBuffers
  // are built, so a bad option on one rank is the same Error on every rank.
  static model::ModelOptions model_options(Group& g, const EngineOptions& o) {
    std::string problem;
    if (o.max_tokens_per_step < 1)
      problem = fmt::format("EngineOptions::max_tokens_per_step must be >= 1, got {}",
                            o.max_tokens_per_step);
    else if (o.max_batch < 1)
      problem = fmt::format("EngineOptions::max_batch must be >= 1, got {}", o.max_batch);
    else if (o.kv_pages < 0)
      problem = fmt::format(
          "EngineOptions::kv_pages must be >= 0 (0: sized per generate call), "
          "got {}",
          o.kv_pages);
    else if (o.draft_tokens < 0 || o.draft_tokens > 16 || o.draft_tokens >= o.max_tokens_per_step)
      problem = fmt::format(
          "EngineOptions::draft_tokens must be in [0, 16] and below max_tokens_per_step {}, got {}",
          o.max_tokens_per_step, o.draft_tokens);
    agree_or_throw(g, problem);
    model::ModelOptions m = o.model;
    m.max_tokens_per_step = o.max_tokens_per_step;
    return m;
  }

  Impl(std::shared_ptr<const model::ModelWeights> w, Group& g, const EngineOptions& o)
      : weights(w), group(g), opts(o), model(w, g, model_options(g, o)) {
    if (opts.draft_tokens > 0 && !model.has_mtp())
      DI_FAIL(
          "speculative decoding (--speculative mtp) needs the model's MTP module, but the weights "
          "were loaded without one; load them with the MTP module (LoadOptions::mtp) from a "
          "checkpoint that has num_nextn_predict_layers >= 1");
    if (opts.draft_vocab < 0 || opts.draft_vocab > model.config().vocab_size)
      DI_FAIL(
          "the draft vocabulary (--draft-vocab) must be in [1, {}], the model's vocabulary, got {}",
          model.config().vocab_size, opts.draft_vocab);
    if (opts.kv_pages > 0)
      cache = std::make_unique<model::PagedKvCache>(model.kv_cache_config(opts.kv_pages));
  }

  std::string problem_of(const Request& r) const {
    const auto& cfg = model.config();
    std::string p = request_problem(r, cfg.vocab_size, cfg.max_position_embeddings);
    if (p.empty() && cache && pages_needed(r) > cache->config().num_pages)
      p = fmt::format(
          "the prompt ({} tokens) + up to {} new tokens need {} KV pages of {} tokens, more than "
          "the {} pages this rank holds; lower max_new_tokens or raise the page pool",
          r.prompt.size(), r.max_new_tokens, pages_needed(r), kernels::kMlaPageSize,
          cache->config().num_pages);
    if (p.empty() && r.record && opts.draft_tokens > 0 && draft_vocab() != cfg.vocab_size)
      p = "recording a request's MTP logits needs the whole vocabulary; drop --draft-vocab";
    return p;
  }

  void start(Request r) {
    if (!cache) DI_FAIL("Engine::start needs a KV page pool: set EngineOptions::kv_pages > 0");
    if (auto p = problem_of(r); !p.empty()) DI_FAIL("request {}: {}", r.id, p);
    for (const auto& s : active)
      if (s.req.id == r.id) DI_FAIL("request {} is already running on this rank", r.id);
    if (int64_t(active.size()) >= opts.max_batch)
      DI_FAIL("request {}: {} sequences already in flight (max_batch); wait for one to finish",
              r.id, active.size());
    const int64_t need = pages_needed(r);
    if (need > cache->free_pages())
      DI_FAIL("request {}: needs {} KV pages, {} free; wait for a sequence to finish", r.id, need,
              cache->free_pages());
    Seq s;
    s.cache_seq = cache->add_sequence();
    cache->reserve(s.cache_seq, need * kernels::kMlaPageSize);
    s.res.id = r.id;
    s.res.min_router_margin = std::numeric_limits<float>::infinity();
    s.req = std::move(r);
    active.push_back(std::move(s));
  }

  void cancel(int64_t id) {
    for (auto& s : active)
      if (s.req.id == id && !s.done) {
        cache->remove_sequence(s.cache_seq);
        s.done = true;
      }
    std::erase_if(active, [](const Seq& s) { return s.done; });
  }

  std::vector<StepEvent> step() {
    const double t0 = now_s();
    const bool spec = opts.draft_tokens > 0;
    // This rank's step: decode tokens first (latency), then prefill chunks in the budget. With
    // speculation a decode chunk is the last token and its drafts (docs/architecture.md §6.1).
    std::vector<model::SeqChunk> chunks;
    std::vector<size_t> owner;  // active index per chunk
    std::vector<bool> is_prefill;
    int64_t budget = opts.max_tokens_per_step;
    bool any_prefill = false, trace = false;
    for (size_t i = 0; i < active.size() && budget > 0; ++i) {
      Seq& s = active[i];
      if (s.prefilling()) continue;
      // Verify no more drafts than the budget and max_new_tokens leave room for.
      const int64_t room = s.req.max_new_tokens - int64_t(s.res.tokens.size()) - 1;
      const int64_t nd =
          std::max<int64_t>(0, std::min({int64_t(s.drafts.size()), budget - 1, room}));
      s.pending.resize(1);
      s.pending.insert(s.pending.end(), s.drafts.begin(), s.drafts.begin() + nd);
      s.drafts.clear();
      model::SeqChunk c;
      c.cache_seq = s.cache_seq;
      c.tokens = s.pending.data();
      c.num_tokens = 1 + nd;
      c.start_pos = int64_t(s.req.prompt.size() + s.res.tokens.size()) - 1;
      c.all_logits = true;  // one row per verified position
      chunks.push_back(c);
      owner.push_back(i);
      is_prefill.push_back(false);
      budget -= c.num_tokens;
    }
    for (size_t i = 0; i < active.size() && budget > 0; ++i) {
      Seq& s = active[i];
      if (!s.prefilling()) continue;
      model::SeqChunk c;
      c.cache_seq = s.cache_seq;
      c.tokens = s.req.prompt.data() + s.prefilled;
      c.num_tokens = std::min(int64_t(s.req.prompt.size()) - s.prefilled, budget);
      c.start_pos = s.prefilled;
      c.all_logits = s.req.record;
      chunks.push_back(c);
      owner.push_back(i);
      is_prefill.push_back(true);
      budget -= c.num_tokens;
      any_prefill = true;
    }
    for (size_t i : owner) trace = trace || active[i].req.record;
    model::ForwardOutput out = model.forward(chunks, *cache, trace, spec);
    ++stats.steps;

    // Sample every row that ends a prompt or verifies a decode position: row j of a decode chunk
    // draws the sequence's next token j with its own counter, exactly as plain decode would.
    std::vector<int64_t> sample_rows, sample_counter;
    std::vector<size_t> sample_owner;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const int64_t r0 = out.row_begin[ci], r1 = out.row_begin[ci + 1];
      Seq& s = active[owner[ci]];
      if (is_prefill[ci] && s.prefilled + chunks[ci].num_tokens < int64_t(s.req.prompt.size()))
        continue;
      const int64_t first = is_prefill[ci] ? r1 - 1 : r0;
      for (int64_t r = first; r < r1; ++r) {
        sample_rows.push_back(r);
        sample_owner.push_back(owner[ci]);
        sample_counter.push_back(int64_t(s.res.tokens.size()) + (r - first));
      }
    }
    const std::vector<int32_t> sampled = sample(out, sample_rows, sample_owner, sample_counter);

    // Accept the longest prefix of drafts the samples agree with, emit the tokens, record.
    std::vector<StepEvent> events;
    std::vector<model::SeqChunk> mchunks;  // speculation: the MTP module's catch-up
    std::vector<size_t> mowner;
    std::vector<int64_t> mrows;  // row of out.hidden per MTP token
    size_t next_sample = 0;
    int64_t tok_off = 0;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const auto& c = chunks[ci];
      Seq& s = active[owner[ci]];
      const int64_t r0 = out.row_begin[ci], r1 = out.row_begin[ci + 1];
      const int64_t off = tok_off;
      tok_off += c.num_tokens;
      std::vector<int32_t> emitted;
      if (is_prefill[ci]) {
        stats.prefill_tokens += c.num_tokens;
        if (s.req.record) record(s, out, r0, r1, off, c.num_tokens);
        s.prefilled += c.num_tokens;
        if (!s.prefilling()) emitted.push_back(sampled[next_sample++]);
      } else {
        // Targets t_0..t_nd; draft j + 1 (pending[j + 1]) is accepted while it equals t_j.
        const int64_t nd = c.num_tokens - 1;
        int64_t n = 0;
        while (n < nd && s.pending[size_t(n + 1)] == sampled[next_sample + size_t(n)]) ++n;
        emitted.assign(sampled.begin() + int64_t(next_sample),
                       sampled.begin() + int64_t(next_sample) + n + 1);
        next_sample += size_t(nd + 1);
        stats.decode_tokens += c.num_tokens;
        stats.drafted += nd;
        stats.accepted += n;
        if (s.req.record && spec) {
          s.res.drafts.insert(s.res.drafts.end(), s.pending.begin() + 1, s.pending.end());
          s.res.spec_steps.insert(s.res.spec_steps.end(), {nd, n});
        }
      }
      // Emit in order; a stop token or the length limit ends the sequence there.
      size_t m = 0;
      for (; m < emitted.size() && !s.done; ++m) {
        const int32_t tok = emitted[m];
        s.res.tokens.push_back(tok);
        StepEvent ev;
        ev.id = s.req.id;
        ev.token = tok;
        const bool stop =
            std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), tok) != s.req.stop_ids.end();
        if (stop || int64_t(s.res.tokens.size()) >= s.req.max_new_tokens) {
          s.res.finish_reason = stop ? "stop" : "length";
          s.done = true;
          ev.finished = true;
        }
        events.push_back(std::move(ev));
      }
      emitted.resize(m);
      if (!is_prefill[ci]) {
        stats.decode_emitted += int64_t(m);
        if (s.req.record) record(s, out, r0, r0 + int64_t(m), off, int64_t(m));
        if (!s.done) s.pending.assign(1, emitted.back());
      } else if (!emitted.empty() && !s.done) {
        s.pending.assign(1, emitted.back());
      }
      if (!spec || (s.done && !s.req.record)) continue;
      // The MTP module reads each position's state and the token after it: the prompt's next
      // tokens, then the emitted ones.
      model::SeqChunk mc;
      mc.cache_seq = s.cache_seq;
      mc.start_pos = c.start_pos;
      if (is_prefill[ci]) {
        const auto& p = s.req.prompt;
        const int64_t e = c.start_pos + c.num_tokens;
        s.mtp_in.assign(p.begin() + c.start_pos + 1, p.begin() + e);
        s.mtp_in.push_back(e < int64_t(p.size()) ? p[size_t(e)] : emitted.at(0));
      } else {
        s.mtp_in = emitted;
      }
      mc.tokens = s.mtp_in.data();
      mc.num_tokens = int64_t(s.mtp_in.size());
      mc.all_logits = s.req.record;
      for (int64_t j = 0; j < mc.num_tokens; ++j) mrows.push_back(off + j);
      mchunks.push_back(mc);
      mowner.push_back(owner[ci]);
    }
    if (spec) {
      const double td = now_s();
      draft(out, mchunks, mowner, mrows);
      stats.draft_seconds += now_s() - td;
    }
    const double dt = now_s() - t0;
    (any_prefill ? stats.prefill_seconds : stats.decode_seconds) += dt;

    for (auto& ev : events)
      if (ev.finished)
        for (auto& s : active)
          if (s.req.id == ev.id && s.done) {
            ev.result = std::move(s.res);
            cache->remove_sequence(s.cache_seq);
          }
    std::erase_if(active, [](const Seq& s) { return s.done; });
    return events;
  }

  // Speculation: the MTP module catches up on this step's positions (collective), then chains
  // draft_tokens - 1 more single-token steps (collective, every rank the same count); each
  // sequence that decodes next step ends with up to draft_tokens greedy drafts.
  void draft(const model::ForwardOutput& main, const std::vector<model::SeqChunk>& mchunks,
             const std::vector<size_t>& mowner, const std::vector<int64_t>& mrows) {
    const int64_t hid = model.config().hidden_size, V = draft_vocab();
    std::vector<bf16> hin(mrows.size() * size_t(hid));
    for (size_t i = 0; i < mrows.size(); ++i)
      std::memcpy(hin.data() + i * size_t(hid), main.hidden.data<bf16>() + mrows[i] * hid,
                  size_t(hid) * sizeof(bf16));
    model::ForwardOutput o = model.mtp_forward(mchunks, hin.data(), *cache, opts.draft_vocab);
    // The sequences that draft: active index, drafts wanted, next chain position.
    struct Chain {
      size_t seq;
      int64_t want, pos;
    };
    std::vector<Chain> chains;
    std::vector<int64_t> rows;  // logits row per drafting sequence
    std::vector<bf16> h;        // its last hidden row: what the next chain step reads
    for (size_t i = 0; i < mchunks.size(); ++i) {
      Seq& s = active[mowner[i]];
      const int64_t r0 = o.row_begin[i], r1 = o.row_begin[i + 1];
      if (s.req.record) {  // problem_of: only with the whole vocabulary
        const float* lg = o.logits.data<float>();
        s.res.mtp_logits.insert(s.res.mtp_logits.end(), lg + r0 * V, lg + r1 * V);
      }
      const int64_t want =
          std::min(opts.draft_tokens, s.req.max_new_tokens - int64_t(s.res.tokens.size()) - 1);
      if (s.done || s.prefilling() || want < 1) continue;
      chains.push_back({mowner[i], want, mchunks[i].start_pos + mchunks[i].num_tokens});
      rows.push_back(r1 - 1);
      const bf16* last = o.hidden.data<bf16>() + (r1 - 1) * hid;  // mtp_forward: row = logits row
      h.insert(h.end(), last, last + hid);
    }
    std::vector<size_t> seqs;
    for (const auto& ch : chains) seqs.push_back(ch.seq);
    append_argmax(o, rows, seqs);
    for (int64_t step = 1; step < opts.draft_tokens; ++step) {
      std::vector<model::SeqChunk> cc;
      std::vector<bf16> hh;
      std::vector<size_t> live;  // index into chains
      for (size_t i = 0; i < chains.size(); ++i) {
        Chain& ch = chains[i];
        Seq& s = active[ch.seq];
        if (int64_t(s.drafts.size()) >= ch.want) continue;
        model::SeqChunk c;
        c.cache_seq = s.cache_seq;
        c.tokens = &s.drafts.back();
        c.num_tokens = 1;
        c.start_pos = ch.pos++;
        cc.push_back(c);
        hh.insert(hh.end(), h.begin() + int64_t(i) * hid, h.begin() + int64_t(i + 1) * hid);
        live.push_back(i);
      }
      o = model.mtp_forward(cc, hh.data(), *cache, opts.draft_vocab);
      rows.clear();
      seqs.clear();
      for (size_t j = 0; j < live.size(); ++j) {
        std::memcpy(h.data() + live[j] * size_t(hid), o.hidden.data<bf16>() + int64_t(j) * hid,
                    size_t(hid) * sizeof(bf16));
        rows.push_back(int64_t(j));
        seqs.push_back(chains[live[j]].seq);
      }
      append_argmax(o, rows, seqs);
    }
  }

  // The ids the MTP head scores (EngineOptions::draft_vocab).
  int64_t draft_vocab() const {
    return opts.draft_vocab > 0 ? opts.draft_vocab : model.config().vocab_size;
  }

  // Sequence seqs[b] gets the greedy token of logits row rows[b] as its next draft (ties -> lower
  // id, the sampling kernel's argmax).
  void append_argmax(const model::ForwardOutput& o, const std::vector<int64_t>& rows,
                     const std::vector<size_t>& seqs) {
    if (rows.empty()) return;
    const int64_t V = draft_vocab();
    std::vector<float> lg(rows.size() * size_t(V));
    for (size_t b = 0; b < rows.size(); ++b)
      std::memcpy(lg.data() + b * size_t(V), o.logits.data<float>() + rows[b] * V,
                  size_t(V) * sizeof(float));
    std::vector<int32_t> tok(rows.size());
    kernels::SamplingParams sp;  // no temperature: argmax
    sp.logits = lg.data();
    sp.tokens = tok.data();
    sp.batch = int64_t(rows.size());
    sp.vocab = V;
    kernels::KernelTag tag("mtp.draft");
    kernels::sample(sp);
    for (size_t b = 0; b < rows.size(); ++b) active[seqs[b]].drafts.push_back(tok[b]);
  }

  void record(Seq& s, const model::ForwardOutput& out, int64_t r0, int64_t r1, int64_t tok_off,
              int64_t num_tokens) {
    const int64_t V = model.config().vocab_size, K = model.config().num_experts_per_tok;
    RequestResult& res = s.res;
    const float* lg = out.logits.data<float>();
    res.logits.insert(res.logits.end(), lg + r0 * V, lg + r1 * V);
    res.num_positions += r1 - r0;
    const auto& rt = out.routing;
    if (res.moe_layers.empty()) {
      res.moe_layers = rt.layers;
      res.routing.resize(rt.layers.size());
    }
    for (size_t l = 0; l < rt.layers.size(); ++l) {
      res.routing[l].insert(res.routing[l].end(), rt.topk[l].begin() + tok_off * K,
                            rt.topk[l].begin() + (tok_off + num_tokens) * K);
      for (int64_t j = 0; j < num_tokens; ++j)
        res.min_router_margin = std::min(res.min_router_margin, rt.margins[l][size_t(tok_off + j)]);
    }
  }

  // One token per row: each row's own logits and settings (docs/numerics.md §9).
  std::vector<int32_t> sample(const model::ForwardOutput& out, const std::vector<int64_t>& rows_at,
                              const std::vector<size_t>& row_owner,
                              const std::vector<int64_t>& row_counter) {
    const int64_t V = model.config().vocab_size;
    const size_t nb = rows_at.size();
    std::vector<int32_t> tokens(nb);
    if (nb == 0) return tokens;
    std::vector<float> rows(nb * size_t(V)), temp(nb), top_p(nb);
    std::vector<int32_t> top_k(nb);
    std::vector<int64_t> seed(nb), counter(nb);
    for (size_t b = 0; b < nb; ++b) {
      std::memcpy(rows.data() + int64_t(b) * V, out.logits.data<float>() + rows_at[b] * V,
                  size_t(V) * sizeof(float));
      const Seq& s = active[row_owner[b]];
      const SamplingConfig& sc = s.req.sampling;
      temp[b] = sc.temperature;
      top_k[b] = sc.top_k;
      top_p[b] = sc.top_p;
      seed[b] = int64_t(sc.seed);
      counter[b] = row_counter[b];
    }
    kernels::SamplingParams sp;
    sp.logits = rows.data();
    sp.temperature = temp.data();
    sp.top_k = top_k.data();
    sp.top_p = top_p.data();
    sp.seed = seed.data();
    sp.counter = counter.data();
    sp.tokens = tokens.data();
    sp.batch = int64_t(nb);
    sp.vocab = V;
    kernels::KernelTag tag("sample");
    kernels::sample(sp);
    return tokens;
  }

  std::vector<RequestResult> generate(const std::vector<Request>& reqs,
                                      const TokenCallback& on_token) {
    DI_CHECK(active.empty(), "Engine::generate while the step-level API has {} sequences running",
             active.size());
    // A pool sized for this call's requests when the options give none.
    if (opts.kv_pages == 0) {
      int64_t pages = 1;
      for (const auto& r : reqs) pages += pages_needed(r);
      cache = std::make_unique<model::PagedKvCache>(model.kv_cache_config(pages));
    }
    // Agreed before the first step: a rank that threw here alone would leave its peers waiting
    // in the step's all_reduce.
    std::string problem;
    for (const auto& r : reqs) {
      problem = problem_of(r);
      if (!problem.empty()) {
        problem = fmt::format("request {}: {}", r.id, problem);
        break;
      }
    }
    agree_or_throw(group, problem);
    std::vector<RequestResult> results(reqs.size());
    std::map<int64_t, size_t> index_of;
    for (size_t i = 0; i < reqs.size(); ++i) {
      DI_CHECK(index_of.emplace(reqs[i].id, i).second, "two requests have the id {}", reqs[i].id);
      results[i].id = reqs[i].id;
    }
    size_t next = 0;  // FIFO: the next request to start
    for (;;) {
      while (next < reqs.size() && int64_t(active.size()) < opts.max_batch &&
             pages_needed(reqs[next]) <= cache->free_pages())
        start(reqs[next++]);
      int32_t running = active.empty() ? 0 : 1;
      group.all_reduce(&running, 1, DType::i32, ReduceOp::max);
      if (running == 0) break;
      for (auto& ev : step()) {
        if (on_token) on_token(ev.id, ev.token);
        if (ev.finished) results[index_of.at(ev.id)] = std::move(ev.result);
      }
    }
    if (opts.kv_pages == 0) cache.reset();
    return results;
  }
};

Engine::Engine(std::shared_ptr<const model::ModelWeights> weights, Group& group,
               const EngineOptions& opts)
    : impl_(std::make_unique<Impl>(std::move(weights), group, opts)) {}
Engine::~Engine() = default;

int64_t Engine::total_pages() const { return impl_->cache ? impl_->cache->config().num_pages : 0; }
int64_t Engine::free_pages() const { return impl_->cache ? impl_->cache->free_pages() : 0; }
int64_t Engine::num_active() const { return int64_t(impl_->active.size()); }
void Engine::start(Request r) { impl_->start(std::move(r)); }
void Engine::cancel(int64_t id) { impl_->cancel(id); }
std::vector<StepEvent> Engine::step() { return impl_->step(); }
std::vector<RequestResult> Engine::generate(const std::vector<Request>& requests,
                                            const TokenCallback& on_token) {
  return impl_->generate(requests, on_token);
}
model::DeepseekModel& Engine::model() { return impl_->model; }
const EngineStats& Engine::stats() const { return impl_->stats; }

// ---- gather_results: a flat byte encoding moved with all_gather_v ------------------------------

std::vector<RequestResult> gather_results(Group& group, const std::vector<RequestResult>& local) {
  ByteWriter w;
  w.pod(uint64_t(local.size()));
  for (const auto& r : local) {
    w.pod(r.id);
    w.vec(r.tokens);
    w.str(r.finish_reason);
    w.pod(r.num_positions);
    w.vec(r.logits);
    w.vec(r.moe_layers);
    w.pod(uint64_t(r.routing.size()));
    for (const auto& x : r.routing) w.vec(x);
    w.pod(r.min_router_margin);
    w.vec(r.mtp_logits);
    w.vec(r.drafts);
    w.vec(r.spec_steps);
  }
  const int W = group.size();
  std::vector<int64_t> sizes(static_cast<size_t>(W));
  int64_t mine = int64_t(w.bytes.size());
  group.all_gather(&mine, sizes.data(), 1, DType::i64);
  std::vector<size_t> counts(static_cast<size_t>(W));
  size_t total = 0;
  for (int r = 0; r < W; ++r) total += counts[size_t(r)] = size_t(sizes[size_t(r)]);
  std::vector<uint8_t> all(std::max<size_t>(total, 1));
  group.all_gather_v(w.bytes.data(), w.bytes.size(), all.data(), counts, DType::u8);
  std::vector<RequestResult> out;
  ByteReader rd(all.data(), total);
  for (int r = 0; r < W; ++r) {
    const auto n = rd.pod<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) {
      RequestResult x;
      x.id = rd.pod<int64_t>();
      x.tokens = rd.vec<int32_t>();
      x.finish_reason = rd.str();
      x.num_positions = rd.pod<int64_t>();
      x.logits = rd.vec<float>();
      x.moe_layers = rd.vec<int64_t>();
      const auto nl = rd.pod<uint64_t>();
      for (uint64_t l = 0; l < nl; ++l) x.routing.push_back(rd.vec<int64_t>());
      x.min_router_margin = rd.pod<float>();
      x.mtp_logits = rd.vec<float>();
      x.drafts = rd.vec<int32_t>();
      x.spec_steps = rd.vec<int64_t>();
      out.push_back(std::move(x));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return out;
}

}  // namespace deepinfer::runtime
