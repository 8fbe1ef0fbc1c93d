#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "common/check.h"

namespace moonrun {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool in_vocab(int32_t t, size_t vocab) { return t >= 0 && static_cast<size_t>(t) < vocab; }

}  // namespace

std::vector<double> softmax(const std::vector<float>& logits) {
  // Doubles: top-p compares cumulative sums against 1 - p, and float sums drift enough to
  // flip a token sitting on the boundary.
  std::vector<double> p(logits.size(), 0.0);
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, x);
  if (max_logit == kNegInf) return p;
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = logits[i] == kNegInf ? 0.0 : std::exp(static_cast<double>(logits[i]) - max_logit);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

std::vector<float> log_softmax(const float* logits, int vocab) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < vocab; ++i) max_logit = std::max(max_logit, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_logit);
  const double log_z = max_logit + std::log(sum);
  std::vector<float> out(vocab);
  for (int i = 0; i < vocab; ++i) out[i] = static_cast<float>(logits[i] - log_z);
  return out;
}

int32_t argmax(const std::vector<float>& logits) {
  // std::max_element returns the first of equal maxima, as torch.argmax does.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void apply_penalties(std::vector<float>& logits, const SamplingParams& params,
                     std::span<const int32_t> prompt, std::span<const int32_t> output) {
  const size_t vocab = logits.size();
  if (params.repetition_penalty != 1.0f) {
    // Every token seen in the prompt or the output, once each.
    std::vector<int32_t> seen;
    seen.reserve(prompt.size() + output.size());
    for (int32_t t : prompt) if (in_vocab(t, vocab)) seen.push_back(t);
    for (int32_t t : output) if (in_vocab(t, vocab)) seen.push_back(t);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float r = params.repetition_penalty;
    for (int32_t t : seen) logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : output) if (in_vocab(t, vocab)) ++counts[t];
    for (const auto& [t, c] : counts) {
      logits[t] -= params.frequency_penalty * static_cast<float>(c);
      logits[t] -= params.presence_penalty;
    }
  }
}

void apply_temperature(std::vector<float>& logits, float temperature) {
  if (temperature == 1.0f) return;
  for (float& x : logits) x /= temperature;
}

void apply_min_p(std::vector<float>& logits, float min_p) {
  if (min_p <= 0.0f) return;
  const std::vector<double> p = softmax(logits);
  const double threshold = min_p * *std::max_element(p.begin(), p.end());
  for (size_t i = 0; i < logits.size(); ++i)
    if (p[i] < threshold) logits[i] = kNegInf;
}

void apply_top_k_top_p(std::vector<float>& logits, int top_k, float top_p) {
  const int vocab = static_cast<int>(logits.size());
  if (top_k > 0 && top_k < vocab) {
    // Keep every logit >= the k-th largest (ties at the boundary all stay, as in vLLM).
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[top_k - 1];
    for (float& x : logits)
      if (x < kth) x = kNegInf;
  }
  if (top_p < 1.0f) {
    // vLLM's rule, in ascending order: drop a token while the mass at or below it is
    // <= 1 - top_p. Seen from the top that is: keep the best tokens until their mass first
    // reaches top_p (a token is kept iff the mass strictly above it is < top_p). Sorting the
    // whole vocabulary (163840 in K3) per token is the cost to avoid: sort only the best m,
    // and widen m in the rare case that they do not reach top_p.
    const std::vector<double> p = softmax(logits);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    auto by_prob_desc = [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
    int n_keep = vocab;
    for (int m = std::min(vocab, 64);; m = std::min(vocab, m * 8)) {
      std::partial_sort(order.begin(), order.begin() + m, order.end(), by_prob_desc);
      double above = 0.0;  // mass of the tokens before order[i]
      int i = 0;
      for (; i < m && above < top_p; ++i) above += p[order[i]];
      if (above >= top_p || m == vocab) {
        n_keep = std::max(i, 1);
        break;
      }
    }
    for (int i = n_keep; i < vocab; ++i) logits[order[i]] = kNegInf;
  }
}

namespace {

// Steps 2-4 up to the distribution; returns the penalised logits for greedy in *penalised.
std::vector<float> processed_logits(const float* raw_logits, int vocab, const SamplingParams& params,
                                    std::span<const int32_t> prompt, std::span<const int32_t> output,
                                    std::vector<float>* penalised) {
  std::vector<float> logits(raw_logits, raw_logits + vocab);
  apply_penalties(logits, params, prompt, output);
  if (penalised) *penalised = logits;
  apply_temperature(logits, params.temperature);
  apply_min_p(logits, params.min_p);
  apply_top_k_top_p(logits, params.top_k, params.top_p);
  return logits;
}

}  // namespace

std::vector<double> sampling_distribution(const float* raw_logits, int vocab, const SamplingParams& params,
                                          std::span<const int32_t> prompt, std::span<const int32_t> output) {
  MR_CHECK(!params.greedy()) << "greedy sampling has no distribution";
  return softmax(processed_logits(raw_logits, vocab, params, prompt, output, nullptr));
}

SampleResult sample_token(const float* raw_logits, int vocab, const SamplingParams& params,
                          std::span<const int32_t> prompt, std::span<const int32_t> output,
                          SamplerRng& rng) {
  MR_CHECK(vocab > 0) << "empty logits row";
  SampleResult result;
  if (params.greedy()) {
    std::vector<float> logits(raw_logits, raw_logits + vocab);
    apply_penalties(logits, params, prompt, output);
    result.token = argmax(logits);
  } else {
    const std::vector<double> p =
        softmax(processed_logits(raw_logits, vocab, params, prompt, output, nullptr));
    // Inverse CDF; the fallback picks the last token with mass when rounding leaves u above
    // the total.
    const double u = rng.uniform();
    double cumulative = 0.0;
    int32_t last_nonzero = 0;
    result.token = -1;
    for (int i = 0; i < vocab; ++i) {
      if (p[i] <= 0.0) continue;
      last_nonzero = i;
      cumulative += p[i];
      if (u < cumulative) {
        result.token = i;
        break;
      }
    }
    if (result.token < 0) result.token = last_nonzero;
  }
  if (params.logprobs >= 0) {
    const std::vector<float> lp = log_softmax(raw_logits, vocab);
    result.logprob = lp[result.token];
    const int k = std::min(params.logprobs, vocab);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
    });
    for (int i = 0; i < k; ++i) result.top.push_back({order[i], lp[order[i]]});
  }
  return result;
}

}  // namespace moonrun
