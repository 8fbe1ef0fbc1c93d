// What structured output costs a decode step: the same batch decoded on the CPU engine
// with and without a JSON-schema token constraint, step by step, best of several runs.
//
//   constrained_decode_bench MODEL_DIR [--batch B] [--tokens N] [--repeat R]
//
// MODEL_DIR is the demo model (build/demo-model) or any checkpoint with a tokenizer. Each
// run decodes B sequences of N tokens (temperature 1, ignore_eos, so both modes run the
// same number of steps); the constrained mode builds the server's grammar for a nested
// response_format schema (thinking off: the JSON grammar is active on every step) and
// times the constraint's own work (fill_allowed + accept) as well. Printed: the mean
// decode step time of each mode (CPU time, median and best of the runs), their ratio,
// and the mask time per step, warm and cold (the first run, mask caches empty). Run with
// MOONRUN_CPU_THREADS=1 so that a step's CPU time is its work.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chat/chat_request.h"
#include "chat/output_grammar.h"
#include "chat/render_chat.h"
#include "chat/tokenizer.h"
#include "engine/engine.h"
#include "grammar/matcher.h"
#include "runtime/runtime_builder.h"
#include "server/detokenize.h"

using namespace moonrun;
using Clock = std::chrono::steady_clock;

namespace {

const char* kRequest = R"({"messages":[{"role":"user","content":"Describe a person as JSON."}],
  "reasoning_effort":"none",
  "response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{
    "type":"object","$defs":{"address":{"type":"object","properties":{"city":{"type":"string"},
      "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city","zip"],"additionalProperties":false}},
    "properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":130},
      "role":{"enum":["admin","user","guest"]},"home":{"$ref":"#/$defs/address"},
      "pets":{"type":"array","maxItems":3,"items":{"type":"object","properties":{"kind":{"enum":["cat","dog"]},
        "legs":{"type":"integer"}},"required":["kind","legs"]}},"verified":{"type":"boolean"}},
    "required":["name","age","role","home","pets","verified"],"additionalProperties":false}}}})";

// The grammar constraint, timing its own calls.
class TimedConstraint final : public TokenConstraint {
 public:
  TimedConstraint(std::shared_ptr<grammar::GrammarRuntime> rt, int64_t max_tokens, double* ns)
      : m_(std::move(rt), max_tokens), ns_(ns) {}
  void fill_allowed(std::span<uint32_t> bits) override {
    const auto t0 = Clock::now();
    m_.fill_allowed(bits);
    *ns_ += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  bool accept(int32_t token) override {
    const auto t0 = Clock::now();
    const bool ok = m_.accept(token);
    *ns_ += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    return ok;
  }
  bool finished() const override { return m_.finished(); }

 private:
  grammar::Matcher m_;
  double* ns_;
};

// CPU time of this process: on a shared machine the wall clock also counts the time other
// processes held the cores; CPU time counts only the work done.
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct RunResult {
  double mean_step_ms = 0;  // decode steps only (every sequence past its prompt), CPU time
  double mask_us_per_step = 0;
  int steps = 0;
};

RunResult run(Runtime& rt, const std::shared_ptr<const chat::Tokenizer>& tok, const std::vector<int32_t>& prompt,
              int batch, int tokens, std::shared_ptr<grammar::GrammarRuntime> grammar, uint64_t seed) {
  EngineConfig ec;
  ec.scheduler.max_running_requests = batch;
  ec.scheduler.max_tokens_per_step = 8192;
  ec.max_model_len = static_cast<int>(prompt.size()) + tokens + 8;
  ec.is_special_token = [tok](int32_t id) { return id >= 0 && tok->is_special(static_cast<uint32_t>(id)); };
  auto engine_cfg = resolve_engine_config(ec, rt.config.max_position_embeddings, rt.cache);
  MR_CHECK(engine_cfg.is_ok()) << engine_cfg.status().message();
  CacheManager cache(rt.cache);
  Engine engine(*engine_cfg, cache, *rt.runner, detokenize_with(tok));

  double mask_ns = 0;
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = tokens;
  p.ignore_eos = true;
  p.skip_special_tokens = false;
  p.n = batch;
  p.seed = seed;
  if (grammar)
    p.make_constraint = [grammar, tokens, &mask_ns] {
      return std::unique_ptr<TokenConstraint>(new TimedConstraint(grammar, tokens, &mask_ns));
    };
  MR_CHECK(engine.add_request(1, prompt, p).is_ok());
  std::vector<RequestOutput> outputs;
  std::vector<double> step_ms;
  double mask_before = 0;
  bool prefilled = false;
  while (engine.has_work()) {
    outputs.clear();
    const double m0 = mask_ns;
    const double t0 = cpu_ms();
    MR_CHECK(engine.step(outputs).is_ok());
    const double ms = cpu_ms() - t0;
    if (prefilled) {
      step_ms.push_back(ms);
    } else {
      mask_before += mask_ns - m0;  // the prefill step's sampling
    }
    prefilled = true;
  }
  RunResult r;
  r.steps = static_cast<int>(step_ms.size());
  for (double ms : step_ms) r.mean_step_ms += ms;
  r.mean_step_ms /= std::max<size_t>(1, step_ms.size());
  r.mask_us_per_step = (mask_ns - mask_before) / 1000.0 / std::max<size_t>(1, step_ms.size());
  return r;
}

// The mask alone on a vocabulary of K3's size (163,840 ids): the demo model's 1,280 tokens
// say little about a real vocabulary, so its tokens are padded with random byte strings of
// 1-12 bytes (printable ASCII and UTF-8 letters, as BPE tokens are) and a random walk under
// the mask times fill_allowed + accept per step, with empty caches and with warm ones.
void synthetic_vocab_mask(const chat::Tokenizer& tok, const std::shared_ptr<const grammar::Grammar>& g, int32_t eos,
                          int tokens) {
  std::mt19937_64 rng(42);
  std::vector<std::string> bytes;
  std::vector<bool> special;
  for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
    special.push_back(tok.is_special(id));
    bytes.push_back(special.back() ? std::string() : std::string(tok.token_bytes(id)));
  }
  const char* pieces[] = {"a", "e", "t", " ", "s", "\"", ",", ":", "{", "}", "0", "1", "\xc3\xa9", "\xe4\xb8\xad", "_", "-"};
  while (bytes.size() < 163840) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < len; ++k) t += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    bytes.push_back(t);
    special.push_back(false);
  }
  auto vocab = std::make_shared<grammar::TokenVocab>(bytes, special, std::vector<int32_t>{eos});
  std::vector<uint32_t> words((vocab->size() + 31) / 32);
  for (int pass = 0; pass < 2; ++pass) {
    auto rt = std::make_shared<grammar::GrammarRuntime>(g, vocab);
    for (int warm = 0; warm < 2; ++warm) {
      grammar::Matcher m(rt, tokens);
      std::mt19937_64 pick(7);
      double ns = 0, worst = 0;
      int steps = 0;
      for (; steps < tokens && !m.finished(); ++steps) {
        std::fill(words.begin(), words.end(), 0u);
        const auto t0 = Clock::now();
        m.fill_allowed(words);
        const double fill = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab->size(); ++t)
          if (words[t / 32] >> (t % 32) & 1u) allowed.push_back(t);
        if (allowed.empty()) break;
        const int32_t t = allowed[pick() % allowed.size()];
        const auto t1 = Clock::now();
        m.accept(t);
        const double step = fill + std::chrono::duration<double, std::nano>(Clock::now() - t1).count();
        ns += step;
        worst = std::max(worst, step);
      }
      if (pass == 1)
        std::printf("synthetic %d-token vocabulary, %s caches: mask %.1f us/step mean, %.2f ms worst (%d steps)\n",
                    vocab->size(), warm ? "warm" : "empty", ns / 1000.0 / std::max(1, steps), worst / 1e6, steps);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: constrained_decode_bench MODEL_DIR [--batch B] [--tokens N] [--repeat R]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int batch = 1, tokens = 200, repeat = 7;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch") batch = std::atoi(argv[i + 1]);
    if (a == "--tokens") tokens = std::atoi(argv[i + 1]);
    if (a == "--repeat") repeat = std::atoi(argv[i + 1]);
  }
  auto tok_r = chat::Tokenizer::load(dir);
  MR_CHECK(tok_r.is_ok()) << tok_r.status().message();
  auto tok = std::make_shared<const chat::Tokenizer>(std::move(tok_r).value());
  RuntimeOptions ro;
  ro.device = "cpu";
  ro.max_running_requests = batch;
  ro.prefix_cache = false;  // every run the same work
  ro.log = false;
  auto rt_r = build_runtime(dir, ro);
  MR_CHECK(rt_r.is_ok()) << rt_r.status().message();
  Runtime rt = std::move(rt_r).value();
  const ModelConfig& cfg = rt.config;

  auto req = chat::parse_chat_request_text(kRequest);
  MR_CHECK(req.is_ok()) << req.status().message();
  auto segments = chat::render_chat(chat::ChatFormat::kKimiK3, *req);
  MR_CHECK(segments.is_ok());
  const std::vector<uint32_t> ids = tok->encode(*segments);
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  auto g = chat::output_grammar(chat::ChatFormat::kKimiK3, *req, *tok);
  MR_CHECK(g.is_ok() && *g) << (g.is_ok() ? "no grammar" : g.status().message());
  const std::vector<int32_t> eos = {static_cast<int32_t>(*tok->special_id("<|end_of_msg|>"))};
  auto runtime = std::make_shared<grammar::GrammarRuntime>(*g, chat::token_vocab(*tok, eos));

  std::printf("model %s: vocab %d, hidden %d, %d layers; batch %d, %d tokens, prompt %zu tokens, %d runs\n",
              dir.c_str(), cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers,
              batch, tokens, prompt.size(), repeat);
  // One run of each first (page faults, the mask caches filling: the cold figures), then
  // the timed runs alternate so that load from other processes hits both modes alike.
  run(rt, tok, prompt, batch, tokens, nullptr, 99);
  const RunResult cold = run(rt, tok, prompt, batch, tokens, runtime, 99);
  std::vector<double> plain_ms, masked_ms, mask_us;
  for (int r = 0; r < repeat; ++r) {
    plain_ms.push_back(run(rt, tok, prompt, batch, tokens, nullptr, 100 + r).mean_step_ms);
    const RunResult m = run(rt, tok, prompt, batch, tokens, runtime, 100 + r);
    masked_ms.push_back(m.mean_step_ms);
    mask_us.push_back(m.mask_us_per_step);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const double plain = median(plain_ms), masked = median(masked_ms);
  std::printf("unconstrained      decode step median %.4f ms, best %.4f ms (CPU time)\n", plain, best(plain_ms));
  std::printf("constrained        decode step median %.4f ms, best %.4f ms (CPU time)\n", masked, best(masked_ms));
  std::printf("mask work          %.2f us/step warm (median), %.2f us/step cold (first run)\n", median(mask_us),
              cold.mask_us_per_step);
  std::printf("overhead: step time %+.2f %% (medians), %+.2f %% (bests); mask work %.2f %% of an unconstrained step\n",
              100.0 * (masked / plain - 1.0), 100.0 * (best(masked_ms) / best(plain_ms) - 1.0),
              100.0 * median(mask_us) / 1000.0 / plain);
  synthetic_vocab_mask(*tok, *g, eos[0], tokens);
  return 0;
}
