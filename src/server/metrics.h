#pragma once
// Prometheus metrics for GET /metrics under vLLM's names (vllm:num_requests_running,
// vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds,
// vllm:request_queue_time_seconds, ...), each with a model_name label, so the Grafana
// dashboards written for vLLM work unchanged (docs/grafana/moonrun.json is one). What vLLM
// has no name for is under moonrun: (KDA state slots, HTTP responses by status, refusals).
// Thread-safe.
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
  // Appends the _bucket/_sum/_count lines for metric `name`; labels: e.g. model_name="x"
  // (without braces; "" for none).
  void render(const std::string& name, std::string& out, const std::string& labels = "") const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bound, non-cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// One finished request's phases (seconds; negative: unknown) and token counts.
struct RequestTimes {
  double e2e_s = -1, queue_s = -1, prefill_s = -1, decode_s = -1;
  int prompt_tokens = 0, generation_tokens = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name = "");
  void set_model_name(std::string name);

  // Counters (monotonic). Token totals come from the engine's own counts each scrape.
  void set_prompt_tokens_total(uint64_t n) { prompt_tokens_ = n; }
  void set_generation_tokens_total(uint64_t n) { generation_tokens_ = n; }
  void set_preemptions_total(uint64_t n) { preemptions_ = n; }
  // Speculative decoding (vLLM's spec_decode counters): verifications, drafts, accepted
  // drafts, and accepted drafts by position (0 = the first draft).
  void set_spec_decode(uint64_t num_drafts, uint64_t draft_tokens, uint64_t accepted_tokens,
                       std::vector<uint64_t> accepted_per_position) {
    std::lock_guard<std::mutex> lock(mu_);
    spec_num_drafts_ = num_drafts;
    spec_draft_tokens_ = draft_tokens;
    spec_accepted_tokens_ = accepted_tokens;
    spec_accepted_per_pos_ = std::move(accepted_per_position);
  }
  // Decode steps that verified nothing: the balance stood aside, or no sequence had a draft.
  void set_spec_idle_steps(uint64_t stand_aside, uint64_t without_drafts) {
    std::lock_guard<std::mutex> lock(mu_);
    spec_stand_aside_steps_ = stand_aside;
    spec_steps_without_drafts_ = without_drafts;
  }
  void add_cached_prompt_tokens(uint64_t n) { cached_prompt_tokens_ += n; }
  void request_finished(const std::string& reason);  // stop | length | tool_calls | abort | error
  void request_done(const RequestTimes& t);           // once per request, all samples finished
  // Every HTTP answer, by status; the 4xx/5xx ones also count as refused requests.
  void response_sent(int http_status);
  void request_rejected(int http_status) { response_sent(http_status); }

  // Gauges, set before each scrape.
  void set_running(int n) { running_ = n; }
  void set_waiting(int n) { waiting_ = n; }
  void set_kv_cache_usage(double fraction) { kv_usage_x1e6_ = static_cast<int64_t>(fraction * 1e6); }
  void set_kda_slots_used(int n) { kda_slots_used_ = n; }
  void set_open_connections(int n) { open_connections_ = n; }

  Histogram& ttft_seconds() { return ttft_; }
  Histogram& itl_seconds() { return itl_; }
  Histogram& e2e_seconds() { return e2e_; }

  std::string render() const;  // Prometheus text exposition format 0.0.4

 private:
  std::string label() const;  // model_name="..." escaped
  std::atomic<uint64_t> prompt_tokens_{0}, generation_tokens_{0}, cached_prompt_tokens_{0}, preemptions_{0};
  std::atomic<int> running_{0}, waiting_{0}, kda_slots_used_{0}, open_connections_{0};
  std::atomic<int64_t> kv_usage_x1e6_{0};
  mutable std::mutex mu_;
  std::string model_name_;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  uint64_t spec_num_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;  // under mu_
  uint64_t spec_stand_aside_steps_ = 0, spec_steps_without_drafts_ = 0;              // under mu_
  std::vector<uint64_t> spec_accepted_per_pos_;
  std::map<int, uint64_t> responses_;         // by HTTP status
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, inference_, prompt_len_, generation_len_;
};

}  // namespace moonrun::server
