#include "engine/logits_processing.h"

#include <algorithm>
#include <limits>

namespace moonrun {

void process_request_logits(const Request& req, std::span<float> row, std::span<const int32_t> eos_token_ids,
                            std::vector<uint32_t>& mask_words) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const SamplingParams& p = req.params;
  const auto vocab = static_cast<int64_t>(row.size());
  auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };

  for (const auto& [token, bias] : p.logit_bias)
    if (in_vocab(token)) row[token] += bias;

  if (req.num_output_tokens() < p.min_tokens) {
    for (int32_t t : eos_token_ids)
      if (in_vocab(t)) row[t] = kNegInf;
    for (int32_t t : p.stop_token_ids)
      if (in_vocab(t)) row[t] = kNegInf;
  }

  if (!req.constraint) return;
  mask_words.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
  if (!req.constraint->finished()) req.constraint->fill_allowed(mask_words);
  bool any = false;
  for (int64_t w = 0; w < static_cast<int64_t>(mask_words.size()); ++w) {
    const uint32_t bits = mask_words[w];
    if (bits == 0xffffffffu) {
      any = true;
      continue;
    }
    const int64_t end = std::min<int64_t>(vocab, (w + 1) * 32);
    for (int64_t t = w * 32; t < end; ++t) {
      if (bits >> (t & 31) & 1u) {
        any |= row[t] != kNegInf;
      } else {
        row[t] = kNegInf;
      }
    }
  }
  // Nothing left (the constraint is done, or min_tokens hides what it wants): end the
  // sequence rather than sample from an empty distribution.
  if (!any)
    for (int32_t t : eos_token_ids)
      if (in_vocab(t)) row[t] = 0.0f;
}

}  // namespace moonrun
