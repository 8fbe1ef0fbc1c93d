#pragma once
// What a request does to its logits row before the sampler sees it, in vLLM's order:
// logit_bias on the raw logits, min_tokens (EOS and stop tokens masked until enough tokens
// were generated), then the structured-output constraint's mask. One function over one
// row, so that it can move to the device with the sampler: the bias is a sparse add, the
// rest are bitmasks over the vocabulary.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"

namespace moonrun {

// row: [vocab] logits of req's next token, changed in place. mask_words: scratch.
void process_request_logits(const Request& req, std::span<float> row, std::span<const int32_t> eos_token_ids,
                            std::vector<uint32_t>& mask_words);

}  // namespace moonrun
