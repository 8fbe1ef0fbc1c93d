// `moonrun bench`: measure any OpenAI-compatible server (moonrun, vLLM, SGLang) under load.
// The load generator lives in tools/bench.cpp; this file is the command line.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "tools/bench.h"
#include "tools/bench_plot.h"

namespace moonrun::cli {

namespace {

struct BenchArgs {
  std::string base_url, model, api_key, endpoint = "chat", dataset, json_out, plot;
  int concurrency = 1;
  int64_t num_prompts = 1, input_len = 128, output_len = 128;
  double request_rate = 0;
  uint64_t seed = 0;
  bool ignore_eos = false, no_progress = false;
  double timeout_s = 600;
};

int run(const BenchArgs& a) {
  tools::BenchConfig c;
  if (std::string err = tools::parse_base_url(a.base_url, &c.target); !err.empty()) {
    std::fprintf(stderr, "moonrun bench: %s\n", err.c_str());
    return 2;
  }
  c.target.api_key = a.api_key;
  c.target.endpoint = a.endpoint == "completions" ? tools::BenchEndpoint::kCompletions : tools::BenchEndpoint::kChat;
  c.target.timeout_s = a.timeout_s;
  c.model = a.model;
  c.concurrency = a.concurrency;
  c.num_prompts = a.num_prompts;
  c.request_rate = a.request_rate;
  c.seed = a.seed;
  c.input_len = a.input_len;
  c.output_len = a.output_len;
  c.dataset = a.dataset;
  c.ignore_eos = a.ignore_eos;
  c.progress = !a.no_progress;
  auto report = tools::run_bench(c);
  if (!report) {
    std::fprintf(stderr, "moonrun bench: %s\n", report.status().message().c_str());
    return report.status().code() == StatusCode::kInvalidArgument || report.status().code() == StatusCode::kNotFound
               ? 2
               : 1;
  }
  std::fputs(tools::format_bench_report(*report).c_str(), stdout);
  if (!a.json_out.empty()) {
    std::ofstream out(a.json_out);
    out << tools::bench_report_to_json(*report).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "moonrun bench: --json-out %s: could not write\n", a.json_out.c_str());
      return 1;
    }
  }
  if (!a.plot.empty()) {
    Status st = tools::write_bench_plot(*report, a.plot);
    if (!st.is_ok()) {
      std::fprintf(stderr, "moonrun bench: --plot %s\n", st.message().c_str());
      return 1;
    }
  }
  return report->completed > 0 ? 0 : 1;  // every request failing is a failed run
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Streaming load test of an OpenAI-compatible server (moonrun, vLLM, SGLang)");
  cmd->add_option("--base-url", a->base_url, "server, e.g. http://127.0.0.1:8000 (/v1 is added)")->required();
  cmd->add_option("--model", a->model, "model name (default: the first of GET /v1/models)");
  cmd->add_option("--concurrency", a->concurrency,
                  "closed loop: requests in flight; with --request-rate: the cap on requests in flight")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--num-prompts", a->num_prompts, "requests to send")->check(CLI::PositiveNumber);
  cmd->add_option("--request-rate", a->request_rate, "Poisson arrivals at this many requests/s (default: closed loop)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "seed for the Poisson arrivals and the synthetic prompts");
  auto* in_len = cmd->add_option("--input-len", a->input_len, "synthetic prompt length in tokens")
                     ->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", a->output_len, "max_tokens per request")->check(CLI::PositiveNumber);
  cmd->add_option("--dataset", a->dataset,
                  "JSONL prompts: {\"prompt\": ...} or {\"messages\": [...]}, optional \"max_tokens\"")
      ->excludes(in_len);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "ask the server to generate exactly max_tokens (vLLM/SGLang ignore_eos)");
  cmd->add_option("--api-key", a->api_key, "sent as Authorization: Bearer KEY");
  cmd->add_option("--endpoint", a->endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->check(CLI::IsMember({"chat", "completions"}));
  cmd->add_option("--timeout", a->timeout_s, "seconds to wait on a silent connection")->check(CLI::PositiveNumber);
  cmd->add_option("--json-out", a->json_out, "write the figures and every request's timings as JSON");
  cmd->add_option("--plot", a->plot, "draw latency and throughput charts into this PNG");
  cmd->add_flag("--no-progress", a->no_progress, "no progress bar on stderr");
  cmd->callback([a] {
    int rc = run(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace moonrun::cli
