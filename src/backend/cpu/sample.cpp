#include "backend/cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "common/check.h"

namespace moonrun::cpu {
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

void apply_mask(std::vector<float>& logits, const uint32_t* allowed_bits) {
  for (size_t t = 0; t < logits.size(); ++t)
    if (!((allowed_bits[t / 32] >> (t % 32)) & 1u)) logits[t] = kNegInf;
}

void apply_biases(std::vector<float>& logits, std::span<const TokenBias> biases) {
  for (const TokenBias& b : biases)
    if (in_vocab(b.token, logits.size())) logits[b.token] += b.bias;
}

void apply_penalties(std::vector<float>& logits, const SamplingRow& row, std::span<const TokenCount> history) {
  const size_t vocab = logits.size();
  // history lists each token seen (prompt or output) once, with its count in the output.
  if (row.repetition_penalty != 1.0f) {
    const float r = row.repetition_penalty;
    for (const TokenCount& h : history)
      if (in_vocab(h.token, vocab)) logits[h.token] = logits[h.token] > 0 ? logits[h.token] / r : logits[h.token] * r;
  }
  if (row.frequency_penalty != 0.0f || row.presence_penalty != 0.0f) {
    for (const TokenCount& h : history) {
      if (!in_vocab(h.token, vocab) || h.output_count == 0) continue;
      logits[h.token] -= row.frequency_penalty * static_cast<float>(h.output_count);
      logits[h.token] -= row.presence_penalty;
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

std::vector<float> edited_logits(const float* raw_logits, int vocab, const SamplingRow& row,
                                 const SamplingBatch& batch) {
  std::vector<float> logits(raw_logits, raw_logits + vocab);
  if (row.mask_row >= 0) apply_mask(logits, batch.allowed.data() + static_cast<size_t>(row.mask_row) * batch.mask_words);
  apply_biases(logits, std::span(batch.biases).subspan(row.bias_begin, row.bias_end - row.bias_begin));
  apply_penalties(logits, row, std::span(batch.history).subspan(row.history_begin, row.history_end - row.history_begin));
  return logits;
}

namespace {

// Step 5 up to the distribution.
std::vector<double> distribution(std::vector<float> logits, const SamplingRow& row) {
  apply_temperature(logits, row.temperature);
  apply_min_p(logits, row.min_p);
  apply_top_k_top_p(logits, row.top_k, row.top_p);
  return softmax(logits);
}

}  // namespace

std::vector<double> sampling_distribution(const float* raw_logits, int vocab, const SamplingRow& row,
                                          const SamplingBatch& batch) {
  MR_CHECK(!row.greedy()) << "greedy sampling has no distribution";
  return distribution(edited_logits(raw_logits, vocab, row, batch), row);
}

SampleResult sample_row(const float* raw_logits, int vocab, const SamplingRow& row, const SamplingBatch& batch) {
  MR_CHECK(vocab > 0) << "empty logits row";
  SampleResult result;
  std::vector<float> logits = edited_logits(raw_logits, vocab, row, batch);
  if (row.greedy()) {
    result.token = argmax(logits);
  } else {
    const std::vector<double> p = distribution(std::move(logits), row);
    // Inverse CDF; the fallback picks the last token with mass when rounding leaves u above
    // the total.
    const double u = row.u;
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
  if (row.logprobs >= 0) add_logprobs(raw_logits, vocab, row.logprobs, result);
  return result;
}

void add_logprobs(const float* raw_logits, int vocab, int k_asked, SampleResult& r) {
  const std::vector<float> lp = log_softmax(raw_logits, vocab);
  r.logprob = lp[r.token];
  const int k = std::min(k_asked, vocab);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  r.top.clear();
  for (int i = 0; i < k; ++i) r.top.push_back({order[i], lp[order[i]]});
}

}  // namespace moonrun::cpu
