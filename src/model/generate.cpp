#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace moonrun {

namespace {
// splitmix64: a fixed, portable generator, so a seed means the same tokens everywhere.
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int32_t sample_token(const float* logits, int vocab, float temperature, uint64_t& rng_state) {
  int best = 0;
  for (int v = 1; v < vocab; ++v)
    if (logits[v] > logits[best]) best = v;
  if (temperature <= 0.0f) return best;
  std::vector<double> p(vocab);
  double z = 0;
  for (int v = 0; v < vocab; ++v) z += (p[v] = std::exp((static_cast<double>(logits[v]) - logits[best]) / temperature));
  const double u = static_cast<double>(splitmix64(rng_state) >> 11) * 0x1.0p-53 * z;  // [0, z)
  double acc = 0;
  for (int v = 0; v < vocab; ++v) {
    acc += p[v];
    if (u < acc) return v;
  }
  return best;
}

int generate_pages_needed(size_t prompt_tokens, const GenerateOptions& opt, int page_size_tokens) {
  const int64_t n_total = static_cast<int64_t>(prompt_tokens) + std::max(opt.max_tokens, 0);
  return static_cast<int>((n_total + page_size_tokens - 1) / page_size_tokens);
}

Result<GenerateResult> generate_with(const ForwardFn& forward, int vocab, int page_size_tokens,
                                     const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  if (opt.max_tokens < 0) return invalid_argument("max_tokens must be >= 0");
  if (!opt.forced_ids.empty() && static_cast<int>(opt.forced_ids.size()) + 1 < opt.max_tokens)
    return invalid_argument("teacher forcing needs max_tokens - 1 forced ids");
  const int V = vocab;
  const int num_pages = generate_pages_needed(prompt.size(), opt, page_size_tokens);
  ForwardBatch batch;
  batch.seqs.resize(1);
  ForwardSeq& seq = batch.seqs[0];
  seq.kda_slot = 0;
  for (int p = 0; p < num_pages; ++p) seq.pages.push_back(p);
  seq.new_token_ids = prompt;

  GenerateResult r;
  std::vector<float> logits(V);
  uint64_t rng = opt.seed;
  auto t0 = std::chrono::steady_clock::now();
  MR_RETURN_IF_ERROR(forward(batch, logits.data()));
  r.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < opt.max_tokens; ++k) {
    if (k > 0) {
      seq.n_past_tokens += static_cast<int>(seq.new_token_ids.size());
      seq.new_token_ids = {opt.forced_ids.empty() ? r.token_ids.back() : opt.forced_ids[k - 1]};
      MR_RETURN_IF_ERROR(forward(batch, logits.data()));
    }
    if (opt.keep_logits) r.logits.insert(r.logits.end(), logits.begin(), logits.end());
    r.token_ids.push_back(sample_token(logits.data(), V, opt.temperature, rng));
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

Result<GenerateResult> generate(const KimiK3Model& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& opt) {
  const ModelConfig& cfg = model.config();
  const int page_size = 64;
  KdaSlotPool kda_pool(cfg, 1);
  MlaPool mla_pool(cfg, std::max(1, generate_pages_needed(prompt.size(), opt, page_size)), page_size);
  auto forward = [&](const ForwardBatch& batch, float* logits) {
    return model.forward(batch, kda_pool, mla_pool.view(), logits);
  };
  return generate_with(forward, cfg.vocab_size, page_size, prompt, opt);
}

}  // namespace moonrun
