#pragma once
// `moonrun bench`: a streaming load generator for any OpenAI-compatible server. Two arrival
// patterns: a closed loop (C workers, each sends its next request when the last one ends) and
// Poisson arrivals at R requests/s (seeded exponential gaps), capped at C in flight. Reports
// the seed's figures (wall time, completion tokens, aggregate and per-stream tok/s) and the
// usual serving latencies (TTFT, ITL, TPOT, end-to-end: mean, median, p90, p99).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tools/bench_client.h"

namespace moonrun::tools {

struct BenchConfig {
  BenchTarget target;
  std::string model;            // "" = ask GET /v1/models for the first id
  int concurrency = 1;          // closed loop: workers; Poisson: the cap on requests in flight
  int64_t num_prompts = 1;
  double request_rate = 0;      // requests/s; 0 or inf = closed loop
  uint64_t seed = 0;            // Poisson gaps and synthetic prompt words
  int64_t input_len = 128;      // synthetic prompts: tokens (approximated by words)
  int64_t output_len = 128;     // max_tokens
  std::string dataset;          // JSONL: {"prompt": ...} or {"messages": [...]}, optional
                                // "max_tokens" / "output_len"
  bool ignore_eos = false;
  bool progress = true;         // the progress bar on stderr
};

// Percentiles the way numpy.percentile does (linear interpolation between order statistics),
// which is what vLLM's and SGLang's benchmark scripts report.
struct Distribution {
  int64_t n = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
Distribution summarize(std::vector<double> values);
double percentile(const std::vector<double>& sorted, double q);  // q in [0, 100]

struct BenchReport {
  BenchConfig config;
  std::string model;
  std::string mode;                  // "closed loop, concurrency 4" / "Poisson 2 req/s ..."
  std::string prompt_note;           // how prompts were made / measured
  double wall_s = 0;
  int64_t completed = 0, failed = 0;
  int64_t completion_tokens = 0;     // over completed requests
  int64_t prompt_tokens = 0;         // from usage; 0 when not reported
  bool tokens_from_usage = true;     // false when any request lacked usage (counted chunks)
  int64_t chunks = 0;                // streamed chunks with text
  double aggregate_tok_per_s = 0;    // completion tokens / wall
  double per_stream_tok_per_s = 0;   // aggregate / streams (the seed's definition)
  double request_per_s = 0;
  Distribution ttft_ms, itl_ms, tpot_ms, e2e_ms, request_tok_per_s;
  std::vector<std::pair<std::string, int64_t>> failures;  // reason -> count
  std::vector<RequestResult> requests;  // kept for --plot
};

// Builds the prompts for the run (synthetic or from --dataset).
Result<std::vector<BenchPrompt>> make_bench_prompts(const BenchConfig& config, std::string* note);

// Poisson arrival offsets (seconds from the start) for n requests at `rate` req/s.
std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed);

Result<BenchReport> run_bench(const BenchConfig& config);

// Figures from finished requests (also used by tests on hand-made results).
BenchReport summarize_requests(const BenchConfig& config, std::vector<RequestResult> requests, double wall_s);

std::string format_bench_report(const BenchReport& report);
nlohmann::json bench_report_to_json(const BenchReport& report);

}  // namespace moonrun::tools
