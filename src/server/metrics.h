#pragma once
// Prometheus metrics for GET /metrics, named after vLLM's (moonrun: prefix instead of vllm:)
// so existing dashboards need only the prefix changed. Thread-safe; values are doubles.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace moonrun::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines for metric `name` to out.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bound, non-cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // Counters (monotonic). Token totals come from the engine's own counts each scrape.
  void set_prompt_tokens_total(uint64_t n) { prompt_tokens_ = n; }
  void set_generation_tokens_total(uint64_t n) { generation_tokens_ = n; }
  void add_cached_prompt_tokens(uint64_t n) { cached_prompt_tokens_ += n; }
  void request_finished(const std::string& reason);  // stop | length | tool_calls | abort | error
  void request_rejected(int http_status);

  // Gauges, set by the engine loop each step.
  void set_running(int n) { running_ = n; }
  void set_waiting(int n) { waiting_ = n; }
  void set_kv_cache_usage(double fraction) { kv_usage_x1e6_ = static_cast<int64_t>(fraction * 1e6); }
  void set_kda_slots_used(int n) { kda_slots_used_ = n; }

  Histogram& ttft_seconds() { return ttft_; }
  Histogram& itl_seconds() { return itl_; }
  Histogram& e2e_seconds() { return e2e_; }

  std::string render() const;  // Prometheus text exposition format 0.0.4

 private:
  std::atomic<uint64_t> prompt_tokens_{0}, generation_tokens_{0}, cached_prompt_tokens_{0};
  std::atomic<int> running_{0}, waiting_{0}, kda_slots_used_{0};
  std::atomic<int64_t> kv_usage_x1e6_{0};
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  std::map<int, uint64_t> rejected_;          // by HTTP status
  Histogram ttft_, itl_, e2e_;
};

}  // namespace moonrun::server
