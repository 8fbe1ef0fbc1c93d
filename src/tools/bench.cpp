// `moonrun bench` load generator and report (see bench.h).
#include "tools/bench.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace moonrun::tools {

using nlohmann::json;

// ---- statistics ------------------------------------------------------------------------

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q / 100.0 * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

Distribution summarize(std::vector<double> v) {
  Distribution d;
  d.n = int64_t(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / double(v.size());
  d.median = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  d.min = v.front();
  d.max = v.back();
  return d;
}

// ---- prompts -----------------------------------------------------------------------------

namespace {

// Common English words: nearly every one is a single token (with its leading space) in the
// BPE vocabularies of K3, Llama and GPT models, so N words is close to N tokens.
const char* const kWords[] = {
    "the",   "of",     "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",   "be",    "by",    "on",    "not",   "he",    "this",  "are",   "or",
    "his",   "from",   "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",
    "were",  "their",  "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",
    "if",    "more",   "when",  "will",  "would", "who",   "so",    "no",    "time",  "people",
    "water", "light",  "river", "world", "house", "city",  "night", "music", "paper", "story",
    "green", "small",  "large", "early", "order", "point", "north", "south", "money", "power",
    "table", "child",  "field", "heart", "place", "voice", "sound", "stone", "glass", "plant",
};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

std::string random_words(std::mt19937_64& rng, int64_t n) {
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, kNumWords - 1);
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

Result<std::vector<BenchPrompt>> load_dataset(const BenchConfig& c) {
  std::ifstream in(c.dataset);
  if (!in) return not_found("--dataset " + c.dataset + ": cannot open");
  std::vector<BenchPrompt> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = c.dataset + ":" + std::to_string(line_no);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(where + ": not a JSON object");
    BenchPrompt p;
    p.max_tokens = c.output_len;
    if (j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty())
        return invalid_argument(where + ": \"messages\" must be a non-empty array");
      p.messages = j["messages"];
      for (const auto& m : p.messages)
        if (m.is_object() && m.contains("content") && m["content"].is_string())
          p.text += m["content"].get<std::string>() + "\n";
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else {
      return invalid_argument(where + ": needs \"prompt\" (string) or \"messages\" (array)");
    }
    for (const char* key : {"max_tokens", "output_len"})
      if (j.contains(key)) {
        if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
          return invalid_argument(where + ": \"" + key + "\" must be a positive integer");
        p.max_tokens = j[key].get<int64_t>();
      }
    rows.push_back(std::move(p));
  }
  if (rows.empty()) return invalid_argument("--dataset " + c.dataset + ": no prompts");
  return rows;
}

}  // namespace

Result<std::vector<BenchPrompt>> make_bench_prompts(const BenchConfig& c, std::string* note) {
  std::vector<BenchPrompt> prompts;
  if (!c.dataset.empty()) {
    auto rows = MR_TRY(load_dataset(c));
    for (int64_t i = 0; i < c.num_prompts; ++i) prompts.push_back(rows[size_t(i) % rows.size()]);
    *note = "dataset " + c.dataset + " (" + std::to_string(rows.size()) + " prompts" +
            (int64_t(rows.size()) < c.num_prompts ? ", cycled" : "") + ")";
    return prompts;
  }
  // Synthetic: words, calibrated against the server's tokenizer when it has /tokenize.
  std::mt19937_64 rng(c.seed);
  double words_per_token = 1.0;
  *note = "synthetic, " + std::to_string(c.input_len) + " words per prompt (~1 token each; server has no /tokenize)";
  if (c.input_len > 0) {
    const int64_t sample_words = 1000;
    std::mt19937_64 sample_rng(c.seed ^ 0x9e3779b97f4a7c15ull);
    const int64_t tokens = server_token_count(c.target, c.model, random_words(sample_rng, sample_words));
    if (tokens > 0) {
      words_per_token = double(sample_words) / double(tokens);
      char buf[160];
      std::snprintf(buf, sizeof buf, "synthetic, %lld tokens per prompt (calibrated by /tokenize: %.3f words/token)",
                    (long long)c.input_len, words_per_token);
      *note = buf;
    }
  }
  const int64_t words = std::max<int64_t>(1, std::llround(double(c.input_len) * words_per_token));
  for (int64_t i = 0; i < c.num_prompts; ++i) {
    BenchPrompt p;
    p.text = random_words(rng, words);  // random words: no two prompts share a cached prefix
    p.max_tokens = c.output_len;
    prompts.push_back(std::move(p));
  }
  return prompts;
}

std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed) {
  std::vector<double> t(size_t(std::max<int64_t>(n, 0)), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return t;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double now = 0;
  for (auto& x : t) {
    x = now;
    now += gap(rng);
  }
  return t;
}

// ---- the run -----------------------------------------------------------------------------

namespace {

Result<std::string> first_model_id(const BenchTarget& target) {
  httplib::Client http(target.scheme_host_port);
  http.set_connection_timeout(10, 0);
  http.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!target.api_key.empty()) headers.emplace("Authorization", "Bearer " + target.api_key);
  auto res = http.Get((target.api_prefix + "/models").c_str(), headers);
  if (!res)
    return unavailable("--model not given and GET " + target.scheme_host_port + target.api_prefix +
                       "/models failed: " + httplib::to_string(res.error()));
  json j = json::parse(res->body, nullptr, false);
  if (res->status != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return unavailable("--model not given and GET " + target.api_prefix + "/models returned HTTP " +
                       std::to_string(res->status) + " without a model id");
  return j["data"][0]["id"].get<std::string>();
}

// The progress bar: one line on stderr, redrawn in place on a terminal, every ~10 % otherwise.
class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled), tty_(isatty(2)) {}
  void update(int64_t done, int64_t failed, int64_t tokens, double elapsed_s, bool final_line) {
    if (!enabled_) return;
    const int64_t decile = total_ > 0 ? done * 10 / total_ : 10;
    if (!tty_ && !final_line && decile == last_decile_) return;
    last_decile_ = decile;
    const int width = 30;
    const int filled = total_ > 0 ? int(width * done / total_) : width;
    std::string bar(size_t(filled), '=');
    if (filled < width) bar += '>' + std::string(size_t(width - filled - 1), ' ');
    std::fprintf(stderr, "%s[%s] %lld/%lld requests, %lld failed, %.1f s, %.1f tok/s%s", tty_ ? "\r" : "",
                 bar.c_str(), (long long)done, (long long)total_, (long long)failed, elapsed_s,
                 elapsed_s > 0 ? double(tokens) / elapsed_s : 0.0, tty_ && !final_line ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  int64_t total_;
  bool enabled_, tty_;
  int64_t last_decile_ = -1;
};

}  // namespace

Result<BenchReport> run_bench(const BenchConfig& config) {
  BenchConfig c = config;
  if (c.concurrency < 1) return invalid_argument("--concurrency must be at least 1");
  if (c.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  if (c.model.empty()) c.model = MR_TRY(first_model_id(c.target));
  std::string note;
  std::vector<BenchPrompt> prompts = MR_TRY(make_bench_prompts(c, &note));
  const bool poisson = c.request_rate > 0 && !std::isinf(c.request_rate);
  const std::vector<double> arrivals = poisson_arrivals(c.num_prompts, c.request_rate, c.seed);

  std::vector<RequestResult> results(size_t(c.num_prompts));
  std::atomic<int64_t> next{0}, done{0}, failed{0}, tokens{0};
  const auto t0 = BenchClock::now();
  auto worker = [&] {
    BenchClient client(c.target);
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= c.num_prompts) return;
      // Poisson: wait for this request's arrival; when all C workers were busy at that
      // moment it goes out late, which is what a cap on in-flight requests means.
      if (poisson)
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<BenchClock::duration>(
                                               std::chrono::duration<double>(arrivals[size_t(i)])));
      const json body = bench_request_body(c.target, c.model, prompts[size_t(i)], c.ignore_eos);
      RequestResult r = client.run(i, body, t0);
      if (r.ok)
        tokens += r.completion_tokens;
      else
        ++failed;
      results[size_t(i)] = std::move(r);
      ++done;
    }
  };

  Progress progress(c.num_prompts, c.progress);
  std::vector<std::thread> workers;
  const int n_workers = int(std::min<int64_t>(c.concurrency, c.num_prompts));
  for (int w = 0; w < n_workers; ++w) workers.emplace_back(worker);
  std::mutex mu;
  std::condition_variable cv;
  bool all_done = false;
  std::thread reporter([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return all_done; }))
      progress.update(done, failed, tokens, std::chrono::duration<double>(BenchClock::now() - t0).count(), false);
  });
  for (auto& t : workers) t.join();
  const double wall_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(mu);
    all_done = true;
  }
  cv.notify_all();
  reporter.join();
  progress.update(done, failed, tokens, wall_s, true);

  BenchReport report = summarize_requests(c, std::move(results), wall_s);
  report.prompt_note = note;
  return report;
}

BenchReport summarize_requests(const BenchConfig& c, std::vector<RequestResult> requests, double wall_s) {
  BenchReport r;
  r.config = c;
  r.model = c.model;
  const bool poisson = c.request_rate > 0 && !std::isinf(c.request_rate);
  char buf[160];
  if (poisson)
    std::snprintf(buf, sizeof buf, "Poisson arrivals at %g req/s (seed %llu), at most %d in flight", c.request_rate,
                  (unsigned long long)c.seed, c.concurrency);
  else
    std::snprintf(buf, sizeof buf, "closed loop, concurrency %d", c.concurrency);
  r.mode = buf;
  r.wall_s = wall_s;
  std::vector<double> ttft, itl, tpot, e2e, rate;
  std::map<std::string, int64_t> failures;
  for (const auto& q : requests) {
    if (!q.ok) {
      ++r.failed;
      failures[q.error]++;
      continue;
    }
    ++r.completed;
    r.completion_tokens += q.completion_tokens;
    r.chunks += q.n_chunks();
    if (q.prompt_tokens >= 0) r.prompt_tokens += q.prompt_tokens;
    if (!q.usage_reported) r.tokens_from_usage = false;
    const double latency = q.end_s - q.start_s;
    ttft.push_back((q.first_token_s - q.start_s) * 1e3);
    e2e.push_back(latency * 1e3);
    if (q.completion_tokens > 1) tpot.push_back((q.end_s - q.first_token_s) / double(q.completion_tokens - 1) * 1e3);
    for (size_t k = 1; k < q.chunk_times_s.size(); ++k) itl.push_back((q.chunk_times_s[k] - q.chunk_times_s[k - 1]) * 1e3);
    if (latency > 0) rate.push_back(double(q.completion_tokens) / latency);
  }
  r.ttft_ms = summarize(ttft);
  r.itl_ms = summarize(itl);
  r.tpot_ms = summarize(tpot);
  r.e2e_ms = summarize(e2e);
  r.request_tok_per_s = summarize(rate);
  if (wall_s > 0) {
    r.aggregate_tok_per_s = double(r.completion_tokens) / wall_s;
    r.request_per_s = double(r.completed) / wall_s;
  }
  const int64_t streams = std::min<int64_t>(c.concurrency, c.num_prompts);
  r.per_stream_tok_per_s = streams > 0 ? r.aggregate_tok_per_s / double(streams) : 0;
  for (const auto& [why, n] : failures) r.failures.push_back({why, n});
  std::sort(r.failures.begin(), r.failures.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  r.requests = std::move(requests);
  return r;
}

// ---- output ------------------------------------------------------------------------------

std::string format_bench_report(const BenchReport& r) {
  std::ostringstream o;
  char buf[256];
  auto row = [&](const char* label, const std::string& value) {
    std::snprintf(buf, sizeof buf, "%-26s: %s\n", label, value.c_str());
    o << buf;
  };
  auto num = [&](const char* f, double v) {
    std::snprintf(buf, sizeof buf, f, v);
    return std::string(buf);
  };
  o << "============ moonrun bench ============\n";
  row("server", r.config.target.scheme_host_port + r.config.target.api_prefix +
                    (r.config.target.endpoint == BenchEndpoint::kChat ? "/chat/completions" : "/completions"));
  row("model", r.model);
  row("load", r.mode);
  row("prompts", r.prompt_note + ", max_tokens " + std::to_string(r.config.output_len) +
                     (r.config.ignore_eos ? ", ignore_eos" : ""));
  row("requests", std::to_string(r.completed) + " completed, " + std::to_string(r.failed) + " failed");
  row("wall time", num("%.2f s", r.wall_s));
  row("completion tokens", std::to_string(r.completion_tokens) +
                               (r.tokens_from_usage ? " (server usage)"
                                                    : " (counted as streamed chunks: the server sent no usage, "
                                                      "so this assumes one token per chunk)"));
  if (r.prompt_tokens > 0) row("prompt tokens", std::to_string(r.prompt_tokens) + " (server usage)");
  row("streamed chunks", std::to_string(r.chunks));
  row("aggregate tok/s", num("%.1f", r.aggregate_tok_per_s));
  row("per-stream tok/s", num("%.1f", r.per_stream_tok_per_s) + " (aggregate / " +
                              std::to_string(std::min<int64_t>(r.config.concurrency, r.config.num_prompts)) +
                              " streams)");
  row("per-request tok/s (mean)", num("%.1f", r.request_tok_per_s.mean));
  row("request throughput", num("%.3f req/s", r.request_per_s));
  std::snprintf(buf, sizeof buf, "\n%-26s %10s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p90", "p99");
  o << buf;
  for (const auto& [name, d] : {std::pair<const char*, const Distribution*>{"TTFT", &r.ttft_ms},
                                {"ITL (per chunk)", &r.itl_ms},
                                {"TPOT", &r.tpot_ms},
                                {"end-to-end", &r.e2e_ms}}) {
    std::snprintf(buf, sizeof buf, "%-26s %10.2f %10.2f %10.2f %10.2f\n", name, d->mean, d->median, d->p90, d->p99);
    o << buf;
  }
  if (!r.failures.empty()) {
    o << "\nfailures\n";
    for (const auto& [why, n] : r.failures) o << "  " << n << " x " << why << "\n";
  }
  return o.str();
}

json bench_report_to_json(const BenchReport& r) {
  auto dist = [](const Distribution& d) {
    return json{{"n", d.n}, {"mean", d.mean}, {"median", d.median}, {"p90", d.p90}, {"p99", d.p99},
                {"min", d.min}, {"max", d.max}};
  };
  json failures = json::array();
  for (const auto& [why, n] : r.failures) failures.push_back({{"reason", why}, {"count", n}});
  json per_request = json::array();
  for (const auto& q : r.requests)
    per_request.push_back({{"index", q.index}, {"ok", q.ok}, {"error", q.error}, {"start_s", q.start_s},
                           {"ttft_s", q.ok ? q.first_token_s - q.start_s : -1.0}, {"latency_s", q.end_s - q.start_s},
                           {"completion_tokens", q.completion_tokens}, {"prompt_tokens", q.prompt_tokens},
                           {"chunks", q.n_chunks()}, {"usage_reported", q.usage_reported}});
  const BenchConfig& c = r.config;
  return {
      {"base_url", c.target.scheme_host_port + c.target.api_prefix},
      {"endpoint", c.target.endpoint == BenchEndpoint::kChat ? "chat" : "completions"},
      {"model", r.model},
      {"mode", r.mode},
      {"concurrency", c.concurrency},
      {"num_prompts", c.num_prompts},
      {"request_rate", c.request_rate},
      {"seed", c.seed},
      {"input_len", c.input_len},
      {"output_len", c.output_len},
      {"ignore_eos", c.ignore_eos},
      {"prompts", r.prompt_note},
      // The seed's fields.
      {"wall_s", r.wall_s},
      {"total_completion_tokens", r.completion_tokens},
      {"aggregate_tok_per_s", r.aggregate_tok_per_s},
      {"per_stream_tok_per_s", r.per_stream_tok_per_s},
      // The rest.
      {"completed", r.completed},
      {"failed", r.failed},
      {"tokens_from_usage", r.tokens_from_usage},
      {"total_prompt_tokens", r.prompt_tokens},
      {"streamed_chunks", r.chunks},
      {"request_throughput_per_s", r.request_per_s},
      {"request_tok_per_s", dist(r.request_tok_per_s)},
      {"ttft_ms", dist(r.ttft_ms)},
      {"itl_ms", dist(r.itl_ms)},
      {"tpot_ms", dist(r.tpot_ms)},
      {"e2e_latency_ms", dist(r.e2e_ms)},
      {"failures", failures},
      {"requests", per_request},
  };
}

}  // namespace moonrun::tools
