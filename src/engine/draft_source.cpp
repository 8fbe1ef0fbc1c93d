#include "engine/draft_source.h"

#include <algorithm>

#include "engine/suffix_draft_source.h"

namespace moonrun {

const char* spec_method_name(SpecMethod method) {
  switch (method) {
    case SpecMethod::kNone: return "none";
    case SpecMethod::kNgram: return "ngram";
    case SpecMethod::kSuffix: return "suffix";
    case SpecMethod::kDSpark: return "dspark";
  }
  return "none";
}

Status check_speculative_config(const SpeculativeConfig& c) {
  if (c.num_speculative_tokens < 0 || c.num_speculative_tokens > 32)
    return invalid_argument("speculative decoding: num_speculative_tokens must be in [0, 32], got " +
                            std::to_string(c.num_speculative_tokens));
  if (c.method != SpecMethod::kNone && c.num_speculative_tokens == 0)
    return invalid_argument(std::string("speculative decoding: method ") + spec_method_name(c.method) +
                            " needs num_speculative_tokens >= 1");
  if (c.prompt_lookup_min < 1 || c.prompt_lookup_max < c.prompt_lookup_min)
    return invalid_argument("speculative decoding: need 1 <= prompt_lookup_min <= prompt_lookup_max, got " +
                            std::to_string(c.prompt_lookup_min) + " and " + std::to_string(c.prompt_lookup_max));
  if (c.disable_by_batch_size < 0)
    return invalid_argument("speculative decoding: disable_by_batch_size must be >= 0");
  if (c.suffix_max_tree_depth < 1 || c.suffix_max_tree_depth > 1024)
    return invalid_argument("speculative decoding: suffix_decoding_max_tree_depth must be in [1, 1024], got " +
                            std::to_string(c.suffix_max_tree_depth));
  if (c.suffix_max_cached_requests < 0)
    return invalid_argument("speculative decoding: suffix_decoding_max_cached_requests must be >= 0");
  if (!(c.suffix_max_spec_factor >= 0))
    return invalid_argument("speculative decoding: suffix_decoding_max_spec_factor must be >= 0");
  if (c.method == SpecMethod::kDSpark && c.draft_model.empty())
    return invalid_argument("speculative decoding: method dspark needs the draft model (\"model\" in "
                            "--speculative-config, or --speculative-draft-model-path)");
  if (!(c.dspark_confidence_threshold >= 0 && c.dspark_confidence_threshold < 1))
    return invalid_argument("speculative decoding: the DSpark confidence threshold must be in [0, 1)");
  if (!(c.suffix_min_token_prob >= 0 && c.suffix_min_token_prob <= 1))
    return invalid_argument("speculative decoding: suffix_decoding_min_token_prob must be in [0, 1]");
  return Status::ok();
}

void NgramDraftSource::propose(const DraftRequest& request, int max_tokens, std::vector<int32_t>& drafts) {
  const std::span<const int32_t> prompt = request.prompt, output = request.output;
  const int P = static_cast<int>(prompt.size()), L = P + static_cast<int>(output.size());
  if (max_tokens <= 0 || L < min_n_ + 1) return;
  auto at = [&](int i) { return i < P ? prompt[i] : output[i - P]; };
  // Every earlier position i that ends a match of the last token, scanned backwards from the
  // most recent: the match length there (up to max_n), keeping the longest, the most recent
  // among equals. A full-length match ends the scan.
  const int last = at(L - 1);
  const int lowest = std::max(0, L - 1 - kMaxLookbackTokens);
  int best_len = 0, best_end = -1;  // the match ends at best_end (its last token's index)
  for (int i = L - 2; i >= lowest; --i) {
    if (at(i) != last) continue;
    int len = 1;
    while (len < max_n_ && i - len >= 0 && at(i - len) == at(L - 1 - len)) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = i;
      if (len == max_n_) break;
    }
  }
  if (best_len < min_n_) return;
  for (int j = best_end + 1; j < L && static_cast<int>(drafts.size()) < max_tokens; ++j) drafts.push_back(at(j));
}

std::unique_ptr<DraftSource> make_draft_source(const SpeculativeConfig& config) {
  if (!config.enabled()) return nullptr;
  switch (config.method) {
    case SpecMethod::kNgram: return std::make_unique<NgramDraftSource>(config.prompt_lookup_min, config.prompt_lookup_max);
    case SpecMethod::kSuffix: return std::make_unique<SuffixDraftSource>(config);
    case SpecMethod::kNone:
    case SpecMethod::kDSpark: break;
  }
  return nullptr;
}

}  // namespace moonrun
