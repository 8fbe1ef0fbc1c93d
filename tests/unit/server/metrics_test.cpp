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
  Metrics m;
  m.set_running(3);
  m.set_waiting(2);
  m.set_generation_tokens_total(10);
  m.request_finished("stop");
  m.request_finished("stop");
  std::string text = m.render();
  EXPECT_NE(text.find("moonrun:num_requests_running 3\n"), std::string::npos);
  EXPECT_NE(text.find("moonrun:num_requests_waiting 2\n"), std::string::npos);
  EXPECT_NE(text.find("moonrun:generation_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("moonrun:request_success_total{finished_reason=\"stop\"} 2\n"), std::string::npos);
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
