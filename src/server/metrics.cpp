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
std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
std::vector<double> token_buckets() {
  // vLLM's 1-2-5 series up to the largest context.
  std::vector<double> b;
  for (double p = 1; p <= 1e6; p *= 10)
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * p);
  b.push_back(1048576);
  return b;
}
std::vector<double> phase_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
          960.0, 1920.0, 7680.0};
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

void Histogram::render(const std::string& name, std::string& out, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string pre = labels.empty() ? "" : labels + ",";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + pre + "le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{" + pre + "le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum" + plain + " " + fmt(sum_) + "\n";
  out += name + "_count" + plain + " " + std::to_string(count_) + "\n";
}

// Buckets as vLLM uses for TTFT / ITL / e2e latency (seconds).
Metrics::Metrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0}),
      e2e_(phase_buckets()),
      queue_(phase_buckets()),
      prefill_(phase_buckets()),
      decode_(phase_buckets()),
      inference_(phase_buckets()),
      prompt_len_(token_buckets()),
      generation_len_(token_buckets()) {}

void Metrics::set_model_name(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  model_name_ = std::move(name);
}

std::string Metrics::label() const {
  std::lock_guard<std::mutex> lock(mu_);
  return "model_name=\"" + escape_label(model_name_) + "\"";
}

void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}

void Metrics::request_done(const RequestTimes& t) {
  if (t.e2e_s >= 0) e2e_.observe(t.e2e_s);
  if (t.queue_s >= 0) queue_.observe(t.queue_s);
  if (t.prefill_s >= 0) prefill_.observe(t.prefill_s);
  if (t.decode_s >= 0) decode_.observe(t.decode_s);
  if (t.prefill_s >= 0 && t.decode_s >= 0) inference_.observe(t.prefill_s + t.decode_s);
  prompt_len_.observe(t.prompt_tokens);
  generation_len_.observe(t.generation_tokens);
}

void Metrics::response_sent(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[http_status];
}

std::string Metrics::render() const {
  const std::string l = label();
  const std::string lb = "{" + l + "}";
  std::string out;
  auto gauge = [&](const std::string& name, const char* help, const std::string& value) {
    header(out, name, "gauge", help);
    out += name + lb + " " + value + "\n";
  };
  auto counter = [&](const std::string& name, const char* help, uint64_t value) {
    header(out, name, "counter", help);
    out += name + lb + " " + std::to_string(value) + "\n";
  };
  gauge("vllm:num_requests_running", "Requests in the running batch.", std::to_string(running_.load()));
  gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", std::to_string(waiting_.load()));
  const std::string usage = fmt(kv_usage_x1e6_.load() / 1e6);
  gauge("vllm:kv_cache_usage_perc", "Fraction of the MLA latent KV pool in use (0-1).", usage);
  gauge("vllm:gpu_cache_usage_perc", "Same as vllm:kv_cache_usage_perc (the name older dashboards use).", usage);
  counter("vllm:num_preemptions_total", "Preemptions (a running request's caches freed, recomputed later).",
          preemptions_.load());
  counter("vllm:prompt_tokens_total", "Prompt tokens processed.", prompt_tokens_.load());
  counter("vllm:generation_tokens_total", "Tokens generated.", generation_tokens_.load());
  counter("vllm:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", cached_prompt_tokens_.load());
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(out, "vllm:spec_decode_num_drafts_total", "counter", "Verify steps of a sequence that brought drafts.");
    out += "vllm:spec_decode_num_drafts_total" + lb + " " + std::to_string(spec_num_drafts_) + "\n";
    header(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.");
    out += "vllm:spec_decode_num_draft_tokens_total" + lb + " " + std::to_string(spec_draft_tokens_) + "\n";
    header(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.");
    out += "vllm:spec_decode_num_accepted_tokens_total" + lb + " " + std::to_string(spec_accepted_tokens_) + "\n";
    header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "Draft tokens accepted, by position in the draft (0: the first).");
    for (size_t p = 0; p < spec_accepted_per_pos_.size(); ++p)
      out += "vllm:spec_decode_num_accepted_tokens_per_pos_total{" + l + ",position=\"" + std::to_string(p) + "\"} " +
             std::to_string(spec_accepted_per_pos_[p]) + "\n";
    header(out, "moonrun:spec_decode_stand_aside_steps_total", "counter",
           "Decode steps run without drafts because plain steps measured faster at that batch size.");
    out += "moonrun:spec_decode_stand_aside_steps_total" + lb + " " + std::to_string(spec_stand_aside_steps_) + "\n";
    header(out, "moonrun:spec_decode_steps_without_drafts_total", "counter",
           "Decode steps that speculated but where no sequence had a draft to verify.");
    out += "moonrun:spec_decode_steps_without_drafts_total" + lb + " " + std::to_string(spec_steps_without_drafts_) + "\n";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(out, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
    for (const auto& [reason, n] : finished_)
      out += "vllm:request_success_total{" + l + ",finished_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    header(out, "moonrun:http_responses_total", "counter", "HTTP answers by status code (every route).");
    for (const auto& [code, n] : responses_)
      out += "moonrun:http_responses_total{" + l + ",status=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
    header(out, "moonrun:request_rejected_total", "counter",
           "Requests refused or failed, by HTTP status (4xx and 5xx; 503 = overloaded or shutting down).");
    for (const auto& [code, n] : responses_)
      if (code >= 400)
        out += "moonrun:request_rejected_total{" + l + ",status=\"" + std::to_string(code) + "\"} " +
               std::to_string(n) + "\n";
  }
  auto histogram = [&](const Histogram& h, const std::string& name, const char* help) {
    header(out, name, "histogram", help);
    h.render(name, out, l);
  };
  histogram(ttft_, "vllm:time_to_first_token_seconds", "Time to first token.");
  histogram(itl_, "vllm:inter_token_latency_seconds", "Time between consecutive output tokens.");
  histogram(itl_, "vllm:time_per_output_token_seconds", "Same as vllm:inter_token_latency_seconds (older name).");
  histogram(e2e_, "vllm:e2e_request_latency_seconds", "End-to-end request latency.");
  histogram(queue_, "vllm:request_queue_time_seconds", "Time from arrival to the first scheduled step.");
  histogram(prefill_, "vllm:request_prefill_time_seconds", "Time from the first scheduled step to the first token.");
  histogram(decode_, "vllm:request_decode_time_seconds", "Time from the first to the last token.");
  histogram(inference_, "vllm:request_inference_time_seconds", "Prefill plus decode time.");
  histogram(prompt_len_, "vllm:request_prompt_tokens", "Prompt tokens per request.");
  histogram(generation_len_, "vllm:request_generation_tokens", "Generated tokens per request.");
  gauge("moonrun:kda_state_slots_used", "KDA recurrent-state slots held by sequences.", std::to_string(kda_slots_used_.load()));
  gauge("moonrun:http_connections_open", "Open client connections.", std::to_string(open_connections_.load()));
  return out;
}

}  // namespace moonrun::server
