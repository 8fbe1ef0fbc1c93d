#pragma once
// How one request wants its tokens chosen and when it stops. Field names and meanings are
// OpenAI's (and vLLM's for the extensions: top_k, min_p, repetition_penalty, ignore_eos,
// stop_token_ids); validate() gives the one-line error the server returns as HTTP 400.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "runtime/token_constraint.h"

namespace moonrun {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax)
  float top_p = 1.0f;               // (0, 1]: keep the smallest top set with mass >= top_p
  int top_k = 0;                    // 0 or -1: off
  float min_p = 0.0f;               // [0, 1]: drop tokens with p < min_p * p_max
  float presence_penalty = 0.0f;    // [-2, 2], over generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2], over generated tokens
  float repetition_penalty = 1.0f;  // > 0, over prompt and generated tokens; 1: off
  std::optional<uint64_t> seed;     // set: the samples are a function of (seed, logits)
  int max_tokens = -1;              // -1: until the context is full
  int n = 1;                        // parallel samples of the same prompt
  bool ignore_eos = false;
  std::vector<std::string> stop;         // stop strings (not in the output text unless:)
  bool include_stop_str_in_output = false;  // vLLM's: the text ends after the matched stop string
  std::vector<int32_t> stop_token_ids;   // stop tokens (in the ids, not in the text)
  int logprobs = -1;                // -1: none; k >= 0: the chosen token's + the top k
  bool skip_special_tokens = true;  // special tokens add no text (EngineConfig::is_special_token)
  // Added to the raw logits before the penalties (vLLM's order); OpenAI's logit_bias.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // EOS and stop_token_ids are masked until this many tokens were generated (vLLM's).
  int min_tokens = 0;
  // Structured output: makes one constraint per sequence (so n > 1 works); empty: none.
  std::function<std::unique_ptr<TokenConstraint>()> make_constraint;

  bool greedy() const { return temperature < 1e-5f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }

  Status validate() const {
    auto bad = [](const std::string& m) { return invalid_argument(m); };
    if (!(temperature >= 0.0f)) return bad("temperature must be >= 0, got " + std::to_string(temperature));
    if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p must be in (0, 1], got " + std::to_string(top_p));
    if (top_k < -1) return bad("top_k must be -1, 0 (off) or >= 1, got " + std::to_string(top_k));
    if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p must be in [0, 1], got " + std::to_string(min_p));
    if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
      return bad("presence_penalty must be in [-2, 2], got " + std::to_string(presence_penalty));
    if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
      return bad("frequency_penalty must be in [-2, 2], got " + std::to_string(frequency_penalty));
    if (!(repetition_penalty > 0.0f))
      return bad("repetition_penalty must be > 0, got " + std::to_string(repetition_penalty));
    if (max_tokens != -1 && max_tokens < 1) return bad("max_tokens must be >= 1, got " + std::to_string(max_tokens));
    if (min_tokens < 0) return bad("min_tokens must be >= 0, got " + std::to_string(min_tokens));
    if (max_tokens != -1 && min_tokens > max_tokens)
      return bad("min_tokens (" + std::to_string(min_tokens) + ") must not exceed max_tokens (" +
                 std::to_string(max_tokens) + ")");
    for (const auto& [token, bias] : logit_bias)
      if (!(bias >= -100.0f && bias <= 100.0f))
        return bad("logit_bias values must be in [-100, 100], got " + std::to_string(bias) + " for token " +
                   std::to_string(token));
    if (n < 1 || n > 128) return bad("n must be in [1, 128], got " + std::to_string(n));
    if (logprobs < -1 || logprobs > 20) return bad("logprobs must be in [0, 20], got " + std::to_string(logprobs));
    if (min_tokens < 0) return bad("min_tokens must be >= 0, got " + std::to_string(min_tokens));
    if (max_tokens != -1 && min_tokens > max_tokens)
      return bad("min_tokens (" + std::to_string(min_tokens) + ") must not exceed max_tokens (" +
                 std::to_string(max_tokens) + ")");
    for (const auto& [token, bias] : logit_bias)
      if (!(bias >= -100.0f && bias <= 100.0f))
        return bad("logit_bias: the bias of token " + std::to_string(token) + " must be in [-100, 100]");
    for (const auto& s : stop)
      if (s.empty()) return bad("stop strings must not be empty");
    return Status::ok();
  }
};

}  // namespace moonrun
