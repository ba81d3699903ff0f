// The server's Prometheus metrics (GET /metrics), kept with prometheus-cpp's registry and written
// in its text format: requests by HTTP status, prompt and generated tokens, time to first token
// and inter-token latency histograms, running and queued requests, KV pages used and free.
#pragma once

#include <memory>
#include <string>

#include "serve/scheduler.h"

namespace deepinfer::serve {

class Metrics : public SchedulerObserver {
 public:
  Metrics();
  ~Metrics() override;
  void on_request(int http_status);
  void on_prompt_tokens(int64_t n);
  // SchedulerObserver
  void on_first_token(double ttft_s) override;
  void on_token_gap(double itl_s) override;
  void on_tokens(int64_t generated) override;
  // The text exposition, with the gauges taken from `now`.
  std::string render(const SchedulerSnapshot& now);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::serve
