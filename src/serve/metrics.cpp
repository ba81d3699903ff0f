#include "serve/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>
#include <sstream>

namespace deepinfer::serve {

namespace pm = prometheus;

struct Metrics::Impl {
  std::shared_ptr<pm::Registry> reg = std::make_shared<pm::Registry>();
  pm::Family<pm::Counter>& requests = pm::BuildCounter()
                                          .Name("deepinfer_requests_total")
                                          .Help("HTTP requests to the API, by response status")
                                          .Register(*reg);
  pm::Counter& prompt_tokens = pm::BuildCounter()
                                   .Name("deepinfer_prompt_tokens_total")
                                   .Help("Prompt tokens of admitted requests")
                                   .Register(*reg)
                                   .Add({});
  pm::Counter& generated_tokens = pm::BuildCounter()
                                      .Name("deepinfer_generation_tokens_total")
                                      .Help("Tokens generated")
                                      .Register(*reg)
                                      .Add({});
  // Seconds: 1 ms .. 60 s.
  pm::Histogram& ttft =
      pm::BuildHistogram()
          .Name("deepinfer_time_to_first_token_seconds")
          .Help("From admission to the request's first token")
          .Register(*reg)
          .Add({}, pm::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                   1, 2.5, 5, 10, 30, 60});
  pm::Histogram& itl =
      pm::BuildHistogram()
          .Name("deepinfer_inter_token_latency_seconds")
          .Help("Between consecutive tokens of one request")
          .Register(*reg)
          .Add({}, pm::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25, 0.5, 1, 2.5});
  pm::Gauge& running = gauge("deepinfer_requests_running", "Requests generating now");
  pm::Gauge& queued = gauge("deepinfer_requests_waiting", "Requests waiting for KV pages");
  pm::Gauge& pages_used = gauge("deepinfer_kv_pages_used", "KV cache pages in use, all ranks");
  pm::Gauge& pages_free = gauge("deepinfer_kv_pages_free", "KV cache pages free, all ranks");

  pm::Gauge& gauge(const char* name, const char* help) {
    return pm::BuildGauge().Name(name).Help(help).Register(*reg).Add({});
  }
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::on_request(int http_status) {
  impl_->requests.Add({{"status", std::to_string(http_status)}}).Increment();
}
void Metrics::on_prompt_tokens(int64_t n) { impl_->prompt_tokens.Increment(double(n)); }
void Metrics::on_first_token(double s) { impl_->ttft.Observe(s); }
void Metrics::on_token_gap(double s) { impl_->itl.Observe(s); }
void Metrics::on_tokens(int64_t n) { impl_->generated_tokens.Increment(double(n)); }

std::string Metrics::render(const SchedulerSnapshot& now) {
  impl_->running.Set(double(now.running));
  impl_->queued.Set(double(now.queued));
  impl_->pages_used.Set(double(now.pages_used));
  impl_->pages_free.Set(double(now.pages_free));
  std::ostringstream out;
  pm::TextSerializer().Serialize(out, impl_->reg->Collect());
  return out.str();
}

}  // namespace deepinfer::serve
