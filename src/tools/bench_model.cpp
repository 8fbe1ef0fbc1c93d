#include "tools/bench_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "runtime/sequence_sampler.h"

namespace moonrun::tools {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sequence i's tokens: deterministic, spread over the vocabulary.
std::vector<int32_t> tokens_of(int i, int n, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t h = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) * 0xbf58476d1ce4e5b9ull;
  for (int t = 0; t < n; ++t) {
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    ids[t] = static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
  }
  return ids;
}

struct Seq {
  std::vector<int32_t> pages;
  int n_past = 0;
  int32_t last = 0;
};

}  // namespace

Result<ModelBenchReport> run_model_bench(const ModelBenchConfig& c) {
  if (c.batches.empty()) return invalid_argument("--batch: at least one batch size");
  for (int b : c.batches)
    if (b < 1) return invalid_argument("--batch: sizes must be >= 1, got " + std::to_string(b));
  if (c.context_tokens < 1 || c.decode_steps < 1 || c.warmup_steps < 0)
    return invalid_argument("--context and --steps must be >= 1, --warmup >= 0");
  const int max_batch = *std::max_element(c.batches.begin(), c.batches.end());
  const int per_seq = c.context_tokens + c.warmup_steps + c.decode_steps + 1;
  RuntimeOptions ro = c.runtime;
  ro.max_running_requests = max_batch;
  ro.prefix_cache = false;
  ro.page_size_tokens = ro.page_size_tokens > 0 ? ro.page_size_tokens : 16;
  const int ps = ro.page_size_tokens;
  const int pages_per_seq = (std::max(per_seq, c.prefill_tokens) + ps - 1) / ps;
  ro.max_total_tokens = static_cast<int64_t>(max_batch) * pages_per_seq * ps;
  ro.max_tokens_per_step = std::max({c.context_tokens, c.prefill_tokens, max_batch});
  Runtime rt = MR_TRY(build_runtime(c.model, ro));
  StepRunner& runner = *rt.runner;
  const int vocab = rt.config.vocab_size;

  ModelBenchReport report;
  report.model = c.model;
  report.device = rt.device;
  report.dtype = rt.dtype_name;
  report.cuda_graphs = rt.device == "cuda" && ro.cuda_graphs;
  report.context_tokens = c.context_tokens;
  SamplingParams greedy;
  greedy.temperature = 0;
  StepOutput out;

  for (int b : c.batches) {
    // Fresh sequences: slot i, pages [i * pages_per_seq, (i + 1) * pages_per_seq).
    std::vector<Seq> seqs(b);
    for (int i = 0; i < b; ++i) {
      for (int p = 0; p < pages_per_seq; ++p) seqs[i].pages.push_back(i * pages_per_seq + p);
      const std::vector<int32_t> prompt = tokens_of(i, c.context_tokens, vocab, c.seed);
      StepInput in;
      in.before.push_back({-1, i});
      StepSeq s;
      s.new_token_ids = prompt;
      s.state_slot = i;
      s.pages = seqs[i].pages;
      s.sample = true;
      in.seqs.push_back(s);
      SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
      MR_RETURN_IF_ERROR(runner.step(in, out));
      seqs[i].n_past = c.context_tokens;
      seqs[i].last = out.samples[0].token;
    }
    double timed_s = 0;
    for (int step = 0; step < c.warmup_steps + c.decode_steps; ++step) {
      StepInput in;
      std::vector<int32_t> last(b);
      for (int i = 0; i < b; ++i) {
        last[i] = seqs[i].last;
        StepSeq s;
        s.new_token_ids = std::span<const int32_t>(&last[i], 1);
        s.n_past = seqs[i].n_past;
        s.state_slot = i;
        s.pages = seqs[i].pages;
        s.sample = true;
        in.seqs.push_back(s);
        SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
      }
      const auto t0 = std::chrono::steady_clock::now();
      MR_RETURN_IF_ERROR(runner.step(in, out));
      if (step >= c.warmup_steps) timed_s += seconds_since(t0);
      for (int i = 0; i < b; ++i) {
        seqs[i].n_past += 1;
        seqs[i].last = out.samples[i].token;
      }
    }
    DecodeFigure f;
    f.batch = b;
    f.step_ms = 1e3 * timed_s / c.decode_steps;
    f.tok_s = b * c.decode_steps / timed_s;
    report.decode.push_back(f);
  }
  double tok_s_b1 = 0;
  for (const DecodeFigure& f : report.decode)
    if (f.batch == 1) tok_s_b1 = f.tok_s;
  for (DecodeFigure& f : report.decode) f.speedup_vs_b1 = tok_s_b1 > 0 ? f.tok_s / tok_s_b1 : 0;

  if (c.prefill_tokens > 0) {
    const std::vector<int32_t> prompt = tokens_of(999, c.prefill_tokens, vocab, c.seed);
    std::vector<int32_t> pages(pages_per_seq);
    for (int p = 0; p < pages_per_seq; ++p) pages[p] = p;
    StepInput in;
    in.before.push_back({-1, 0});
    StepSeq s;
    s.new_token_ids = prompt;
    s.state_slot = 0;
    s.pages = pages;
    s.sample = true;
    in.seqs.push_back(s);
    SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
    const auto t0 = std::chrono::steady_clock::now();
    MR_RETURN_IF_ERROR(runner.step(in, out));
    report.prefill_tokens = c.prefill_tokens;
    report.prefill_s = seconds_since(t0);
    report.prefill_tok_s = c.prefill_tokens / report.prefill_s;
  }
  return report;
}

std::string format_model_bench(const ModelBenchReport& r) {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "moonrun bench-model: %s on %s (%s, CUDA graphs %s), %d tokens of context\n",
                r.model.c_str(), r.device.c_str(), r.dtype.c_str(), r.cuda_graphs ? "on" : "off", r.context_tokens);
  s += line;
  s += "| batch | decode step (ms) | tok/s | tok/s vs batch 1 |\n|---:|---:|---:|---:|\n";
  for (const DecodeFigure& f : r.decode) {
    std::snprintf(line, sizeof line, "| %d | %.3f | %.1f | %.2fx |\n", f.batch, f.step_ms, f.tok_s, f.speedup_vs_b1);
    s += line;
  }
  if (r.prefill_tokens > 0) {
    std::snprintf(line, sizeof line, "prefill: %d tokens in %.3f s = %.1f tok/s\n", r.prefill_tokens, r.prefill_s,
                  r.prefill_tok_s);
    s += line;
  }
  return s;
}

nlohmann::json model_bench_to_json(const ModelBenchReport& r) {
  nlohmann::json j = {{"model", r.model},           {"device", r.device}, {"dtype", r.dtype},
                      {"cuda_graphs", r.cuda_graphs}, {"context_tokens", r.context_tokens}};
  j["decode"] = nlohmann::json::array();
  for (const DecodeFigure& f : r.decode)
    j["decode"].push_back(
        {{"batch", f.batch}, {"step_ms", f.step_ms}, {"tok_s", f.tok_s}, {"speedup_vs_b1", f.speedup_vs_b1}});
  if (r.prefill_tokens > 0) j["prefill"] = {{"tokens", r.prefill_tokens}, {"seconds", r.prefill_s}, {"tok_s", r.prefill_tok_s}};
  return j;
}

}  // namespace moonrun::tools
