#include "runtime/engine.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/sampling.h"
#include "runtime/requests.h"

namespace deepinfer::runtime {

namespace {

struct Active {
  const Request* req = nullptr;
  size_t result_index = 0;
  int64_t cache_seq = 0;
  int64_t prefilled = 0;         // prompt tokens already in the cache
  std::vector<int32_t> pending;  // the decode input (last generated token)
  bool done = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Engine::Impl {
  std::shared_ptr<const model::ModelWeights> weights;
  Group& group;
  EngineOptions opts;
  model::DeepseekModel model;
  EngineStats stats;

  static model::ModelOptions model_options(const EngineOptions& o) {
    model::ModelOptions m = o.model;
    m.max_tokens_per_step = o.max_tokens_per_step;
    return m;
  }

  Impl(std::shared_ptr<const model::ModelWeights> w, Group& g, const EngineOptions& o)
      : weights(w), group(g), opts(o), model(w, g, model_options(o)) {
    DI_CHECK(opts.max_batch > 0, "max_batch must be positive, got {}", opts.max_batch);
  }

  std::vector<RequestResult> generate(const std::vector<Request>& reqs,
                                      const TokenCallback& on_token) {
    const auto& cfg = model.config();
    const int64_t V = cfg.vocab_size;
    // Agreed before the first step: a rank that threw here alone would leave its peers waiting
    // in the step's all_reduce.
    std::string problem;
    for (const auto& r : reqs) {
      problem = request_problem(r, V, cfg.max_position_embeddings);
      if (!problem.empty()) {
        problem = fmt::format("request {}: {}", r.id, problem);
        break;
      }
    }
    agree_or_throw(group, problem);
    int64_t pages = 1;
    for (const auto& r : reqs) {
      const int64_t len = int64_t(r.prompt.size()) + r.max_new_tokens;
      pages += (len + kernels::kMlaPageSize - 1) / kernels::kMlaPageSize;
    }
    model::PagedKvCache cache(model.kv_cache_config(pages));
    std::vector<RequestResult> results(reqs.size());
    std::deque<size_t> waiting;
    for (size_t i = 0; i < reqs.size(); ++i) {
      results[i].id = reqs[i].id;
      results[i].min_router_margin = std::numeric_limits<float>::infinity();
      waiting.push_back(i);
    }
    std::vector<Active> active;
    for (;;) {
      while (!waiting.empty() && int64_t(active.size()) < opts.max_batch) {
        Active a;
        a.req = &reqs[waiting.front()];
        a.result_index = waiting.front();
        a.cache_seq = cache.add_sequence();
        waiting.pop_front();
        active.push_back(std::move(a));
      }
      int32_t running = active.empty() ? 0 : 1;
      group.all_reduce(&running, 1, DType::i32, ReduceOp::max);
      if (running == 0) break;

      // Build this rank's step: decode tokens first (latency), then prefill chunks in the budget.
      std::vector<model::SeqChunk> chunks;
      std::vector<size_t> owner;  // active index per chunk
      int64_t budget = opts.max_tokens_per_step;
      bool any_prefill = false;
      for (size_t i = 0; i < active.size() && budget > 0; ++i) {
        Active& a = active[i];
        if (a.prefilled < int64_t(a.req->prompt.size())) continue;
        model::SeqChunk c;
        c.cache_seq = a.cache_seq;
        c.tokens = a.pending.data();
        c.num_tokens = 1;
        c.start_pos = int64_t(a.req->prompt.size() + results[a.result_index].tokens.size()) - 1;
        c.all_logits = false;
        chunks.push_back(c);
        owner.push_back(i);
        --budget;
      }
      for (size_t i = 0; i < active.size() && budget > 0; ++i) {
        Active& a = active[i];
        const int64_t left = int64_t(a.req->prompt.size()) - a.prefilled;
        if (left <= 0) continue;
        model::SeqChunk c;
        c.cache_seq = a.cache_seq;
        c.tokens = a.req->prompt.data() + a.prefilled;
        c.num_tokens = std::min(left, budget);
        c.start_pos = a.prefilled;
        c.all_logits = a.req->record;
        chunks.push_back(c);
        owner.push_back(i);
        budget -= c.num_tokens;
        any_prefill = true;
      }
      bool trace = false;
      for (size_t ci = 0; ci < chunks.size(); ++ci) trace = trace || active[owner[ci]].req->record;
      const double t0 = now_s();
      model::ForwardOutput out = model.forward(chunks, cache, trace);
      const double dt = now_s() - t0;
      ++stats.steps;
      (any_prefill ? stats.prefill_seconds : stats.decode_seconds) += dt;

      // Record logits and routing, then sample where a chunk ends at the sequence's last token.
      std::vector<int64_t> sample_rows;
      std::vector<size_t> sample_owner;
      int64_t tok_off = 0;
      for (size_t ci = 0; ci < chunks.size(); ++ci) {
        const auto& c = chunks[ci];
        Active& a = active[owner[ci]];
        RequestResult& res = results[a.result_index];
        const bool is_prefill = c.tokens != a.pending.data();
        (is_prefill ? stats.prefill_tokens : stats.decode_tokens) += c.num_tokens;
        const int64_t r0 = out.row_begin[ci], r1 = out.row_begin[ci + 1];
        if (a.req->record) {
          const float* lg = out.logits.data<float>();
          res.logits.insert(res.logits.end(), lg + r0 * V, lg + r1 * V);
          res.num_positions += r1 - r0;
          const auto& rt = out.routing;
          if (res.moe_layers.empty()) {
            res.moe_layers = rt.layers;
            res.routing.resize(rt.layers.size());
          }
          const int64_t K = cfg.num_experts_per_tok;
          for (size_t l = 0; l < rt.layers.size(); ++l) {
            res.routing[l].insert(res.routing[l].end(), rt.topk[l].begin() + tok_off * K,
                                  rt.topk[l].begin() + (tok_off + c.num_tokens) * K);
            for (int64_t j = 0; j < c.num_tokens; ++j)
              res.min_router_margin =
                  std::min(res.min_router_margin, rt.margins[l][size_t(tok_off + j)]);
          }
        }
        tok_off += c.num_tokens;
        if (is_prefill) {
          a.prefilled += c.num_tokens;
          if (a.prefilled < int64_t(a.req->prompt.size())) continue;
        }
        sample_rows.push_back(r1 - 1);
        sample_owner.push_back(owner[ci]);
      }
      const int64_t B = int64_t(sample_rows.size());
      if (B > 0) {
        const size_t nb = size_t(B);
        std::vector<float> rows(nb * size_t(V)), temp(nb), top_p(nb);
        std::vector<int32_t> top_k(nb), tokens(nb);
        std::vector<int64_t> seed(nb), counter(nb);
        for (int64_t b = 0; b < B; ++b) {
          std::memcpy(rows.data() + b * V, out.logits.data<float>() + sample_rows[size_t(b)] * V,
                      size_t(V) * sizeof(float));
          const Active& a = active[sample_owner[size_t(b)]];
          const SamplingConfig& s = a.req->sampling;
          temp[size_t(b)] = s.temperature;
          top_k[size_t(b)] = s.top_k;
          top_p[size_t(b)] = s.top_p;
          seed[size_t(b)] = int64_t(s.seed);
          counter[size_t(b)] = int64_t(results[a.result_index].tokens.size());
        }
        kernels::SamplingParams sp;
        sp.logits = rows.data();
        sp.temperature = temp.data();
        sp.top_k = top_k.data();
        sp.top_p = top_p.data();
        sp.seed = seed.data();
        sp.counter = counter.data();
        sp.tokens = tokens.data();
        sp.batch = B;
        sp.vocab = V;
        {
          kernels::KernelTag tag("sample");
          kernels::sample(sp);
        }
        for (int64_t b = 0; b < B; ++b) {
          Active& a = active[sample_owner[size_t(b)]];
          RequestResult& res = results[a.result_index];
          const int32_t tok = tokens[size_t(b)];
          res.tokens.push_back(tok);
          if (on_token) on_token(a.req->id, tok);
          const bool stop = std::find(a.req->stop_ids.begin(), a.req->stop_ids.end(), tok) !=
                            a.req->stop_ids.end();
          if (stop || int64_t(res.tokens.size()) >= a.req->max_new_tokens) {
            res.finish_reason = stop ? "stop" : "length";
            a.done = true;
          } else {
            a.pending.assign(1, tok);
          }
        }
      }
      for (auto& a : active)
        if (a.done) cache.remove_sequence(a.cache_seq);
      std::erase_if(active, [](const Active& a) { return a.done; });
    }
    return results;
  }
};

Engine::Engine(std::shared_ptr<const model::ModelWeights> weights, Group& group,
               const EngineOptions& opts)
    : impl_(std::make_unique<Impl>(std::move(weights), group, opts)) {}
Engine::~Engine() = default;

std::vector<RequestResult> Engine::generate(const std::vector<Request>& requests,
                                            const TokenCallback& on_token) {
  return impl_->generate(requests, on_token);
}
model::DeepseekModel& Engine::model() { return impl_->model; }
const EngineStats& Engine::stats() const { return impl_->stats; }

// ---- gather_results: a flat byte encoding moved with all_gather_v ------------------------------

namespace {

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod(uint64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    b.insert(b.end(), p, p + v.size() * sizeof(T));
  }
};

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  template <class T>
  T pod() {
    DI_CHECK(p + sizeof(T) <= end, "gather_results: truncated payload");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const auto n = pod<uint64_t>();
    DI_CHECK(p + n * sizeof(T) <= end, "gather_results: truncated payload");
    std::vector<T> v(n);
    std::memcpy(v.data(), p, n * sizeof(T));
    p += n * sizeof(T);
    return v;
  }
};

}  // namespace

std::vector<RequestResult> gather_results(Group& group, const std::vector<RequestResult>& local) {
  Writer w;
  w.pod(uint64_t(local.size()));
  for (const auto& r : local) {
    w.pod(r.id);
    w.vec(r.tokens);
    w.vec(std::vector<char>(r.finish_reason.begin(), r.finish_reason.end()));
    w.pod(r.num_positions);
    w.vec(r.logits);
    w.vec(r.moe_layers);
    w.pod(uint64_t(r.routing.size()));
    for (const auto& x : r.routing) w.vec(x);
    w.pod(r.min_router_margin);
  }
  const int W = group.size();
  std::vector<int64_t> sizes(static_cast<size_t>(W));
  int64_t mine = int64_t(w.b.size());
  group.all_gather(&mine, sizes.data(), 1, DType::i64);
  std::vector<size_t> counts(static_cast<size_t>(W));
  size_t total = 0;
  for (int r = 0; r < W; ++r) total += counts[size_t(r)] = size_t(sizes[size_t(r)]);
  std::vector<uint8_t> all(std::max<size_t>(total, 1));
  group.all_gather_v(w.b.data(), w.b.size(), all.data(), counts, DType::u8);
  std::vector<RequestResult> out;
  Reader rd{all.data(), all.data() + total};
  for (int r = 0; r < W; ++r) {
    const auto n = rd.pod<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) {
      RequestResult x;
      x.id = rd.pod<int64_t>();
      x.tokens = rd.vec<int32_t>();
      const auto fr = rd.vec<char>();
      x.finish_reason.assign(fr.begin(), fr.end());
      x.num_positions = rd.pod<int64_t>();
      x.logits = rd.vec<float>();
      x.moe_layers = rd.vec<int64_t>();
      const auto nl = rd.pod<uint64_t>();
      for (uint64_t l = 0; l < nl; ++l) x.routing.push_back(rd.vec<int64_t>());
      x.min_router_margin = rd.pod<float>();
      out.push_back(std::move(x));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return out;
}

}  // namespace deepinfer::runtime
