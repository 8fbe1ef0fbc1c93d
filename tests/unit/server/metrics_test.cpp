#include "server/metrics.h"

#include <gtest/gtest.h>

#include <sstream>

namespace moonrun::server {
namespace {

// The Prometheus text format (exposition format 0.0.4): histogram buckets are cumulative,
// the +Inf bucket equals _count, and _sum is the sum of observations.
TEST(Metrics, HistogramFollowsExpositionFormat) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(3.0);
  std::string out;
  h.render("x", out);
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_sum 4.05\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 4\n"), std::string::npos) << out;
}

TEST(Metrics, EveryFamilyHasHelpAndTypeAndGaugesTrackState) {
  Metrics m("moonshotai/Kimi-K3");
  m.set_running(3);
  m.set_waiting(2);
  m.set_generation_tokens_total(10);
  m.request_finished("stop");
  m.request_finished("stop");
  std::string text = m.render();
  // vLLM's names with a model_name label: what vLLM's Grafana dashboards query.
  const std::string l = "model_name=\"moonshotai/Kimi-K3\"";
  EXPECT_NE(text.find("vllm:num_requests_running{" + l + "} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:num_requests_waiting{" + l + "} 2\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:generation_tokens_total{" + l + "} 10\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:request_success_total{" + l + ",finished_reason=\"stop\"} 2\n"), std::string::npos);
  for (const char* family : {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                             "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                             "vllm:request_decode_time_seconds", "vllm:kv_cache_usage_perc"})
    EXPECT_NE(text.find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
  // Each sample line's family must have been declared by a # TYPE line before it.
  std::istringstream in(text);
  std::string line, declared;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      declared = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind(declared, 0), 0u) << line << " not under " << declared;
  }
}

}  // namespace
}  // namespace moonrun::server

namespace moonrun::server {
namespace {

TEST(Metrics, RequestPhasesLandInTheirHistogramsAndRefusalsAreCounted) {
  Metrics m("demo");
  RequestTimes t;
  t.e2e_s = 2.0;
  t.queue_s = 0.2;
  t.prefill_s = 0.3;
  t.decode_s = 1.5;
  t.prompt_tokens = 12;
  t.generation_tokens = 40;
  m.request_done(t);
  m.response_sent(200);
  m.response_sent(503);
  m.response_sent(503);
  const std::string text = m.render();
  EXPECT_NE(text.find("vllm:request_queue_time_seconds_sum{model_name=\"demo\"} 0.2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:request_decode_time_seconds_count{model_name=\"demo\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:request_inference_time_seconds_sum{model_name=\"demo\"} 1.8\n"), std::string::npos);
  EXPECT_NE(text.find("moonrun:request_rejected_total{model_name=\"demo\",status=\"503\"} 2\n"), std::string::npos);
  EXPECT_EQ(text.find("moonrun:request_rejected_total{model_name=\"demo\",status=\"200\"}"), std::string::npos);
}

TEST(Metrics, ModelNameLabelIsEscaped) {
  Metrics m("a\"b\\c");
  EXPECT_NE(m.render().find("model_name=\"a\\\"b\\\\c\""), std::string::npos) << m.render();
}

}  // namespace
}  // namespace moonrun::server
