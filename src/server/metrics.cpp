#include "server/metrics.h"

#include <cmath>
#include <cstdio>

namespace moonrun::server {
namespace {
std::string fmt(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}
void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + fmt(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

// Buckets as vLLM uses for TTFT / ITL / e2e latency (seconds).
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}

void Metrics::request_rejected(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_[http_status];
}

std::string Metrics::render() const {
  std::string out;
  header(out, "moonrun:num_requests_running", "gauge", "Requests in the running batch.");
  out += "moonrun:num_requests_running " + std::to_string(running_.load()) + "\n";
  header(out, "moonrun:num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
  out += "moonrun:num_requests_waiting " + std::to_string(waiting_.load()) + "\n";
  header(out, "moonrun:kv_cache_usage_perc", "gauge", "Fraction of the MLA latent KV pool in use (0-1).");
  out += "moonrun:kv_cache_usage_perc " + fmt(kv_usage_x1e6_.load() / 1e6) + "\n";
  header(out, "moonrun:kda_state_slots_used", "gauge", "KDA recurrent-state slots held by sequences.");
  out += "moonrun:kda_state_slots_used " + std::to_string(kda_slots_used_.load()) + "\n";
  header(out, "moonrun:prompt_tokens_total", "counter", "Prompt tokens processed.");
  out += "moonrun:prompt_tokens_total " + std::to_string(prompt_tokens_.load()) + "\n";
  header(out, "moonrun:prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.");
  out += "moonrun:prompt_tokens_cached_total " + std::to_string(cached_prompt_tokens_.load()) + "\n";
  header(out, "moonrun:generation_tokens_total", "counter", "Tokens generated.");
  out += "moonrun:generation_tokens_total " + std::to_string(generation_tokens_.load()) + "\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(out, "moonrun:request_success_total", "counter", "Finished requests by finish reason.");
    for (const auto& [reason, n] : finished_)
      out += "moonrun:request_success_total{finished_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    header(out, "moonrun:request_rejected_total", "counter", "Requests refused, by HTTP status.");
    for (const auto& [code, n] : rejected_)
      out += "moonrun:request_rejected_total{status=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
  }
  header(out, "moonrun:time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render("moonrun:time_to_first_token_seconds", out);
  header(out, "moonrun:inter_token_latency_seconds", "histogram", "Time between consecutive output tokens.");
  itl_.render("moonrun:inter_token_latency_seconds", out);
  header(out, "moonrun:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render("moonrun:e2e_request_latency_seconds", out);
  return out;
}

}  // namespace moonrun::server
