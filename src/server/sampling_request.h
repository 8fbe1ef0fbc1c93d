#pragma once
// The sampling fields of an OpenAI request body (chat or completions): OpenAI's own
// (temperature, top_p, n, seed, stop, logit_bias, penalties, logprobs) and vLLM's
// extensions (top_k, min_p, min_tokens, repetition_penalty, ignore_eos, stop_token_ids,
// skip_special_tokens), checked for type and range. Errors name the field.
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/sampling_params.h"

namespace moonrun::server {

enum class Endpoint { kChat, kCompletions };

// max_tokens stays -1 when the body has none (the handler fills it from the context).
Result<SamplingParams> sampling_params_from_json(const nlohmann::json& body, Endpoint endpoint);

// Token ids in logit_bias and stop_token_ids must lie in the model's vocabulary.
Status check_token_ids(const SamplingParams& params, int64_t vocab);

}  // namespace moonrun::server
