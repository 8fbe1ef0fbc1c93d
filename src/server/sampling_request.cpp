#include "server/sampling_request.h"

#include <cerrno>
#include <cstdlib>

#include "server/request_json.h"

namespace moonrun::server {
namespace {

using nlohmann::json;

Status number(const json& body, const char* key, float& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return invalid_argument(std::string(key) + ": expected a number, got " + it->type_name());
  out = it->get<float>();
  return Status::ok();
}

Status integer(const json& body, const char* key, int64_t& out, bool& present) {
  auto it = body.find(key);
  present = false;
  if (it == body.end() || it->is_null()) return Status::ok();
  if (!it->is_number_integer()) {
    if (it->is_number_float() && it->get<double>() == static_cast<double>(static_cast<int64_t>(it->get<double>()))) {
      out = static_cast<int64_t>(it->get<double>());
      present = true;
      return Status::ok();
    }
    return invalid_argument(std::string(key) + ": expected an integer, got " + it->type_name());
  }
  out = it->get<int64_t>();
  present = true;
  return Status::ok();
}

// Booleans are read by the one reader every route uses (request_json.h).
Status boolean(const json& body, const char* key, bool& out) {
  auto v = json_bool(body, key, out);
  if (!v.is_ok()) return v.status();
  out = *v;
  return Status::ok();
}

}  // namespace

Result<SamplingParams> sampling_params_from_json(const json& body, Endpoint endpoint) {
  if (!body.is_object()) return invalid_argument("request body must be a JSON object");
  SamplingParams p;
  MR_RETURN_IF_ERROR(number(body, "temperature", p.temperature));
  MR_RETURN_IF_ERROR(number(body, "top_p", p.top_p));
  MR_RETURN_IF_ERROR(number(body, "min_p", p.min_p));
  MR_RETURN_IF_ERROR(number(body, "presence_penalty", p.presence_penalty));
  MR_RETURN_IF_ERROR(number(body, "frequency_penalty", p.frequency_penalty));
  MR_RETURN_IF_ERROR(number(body, "repetition_penalty", p.repetition_penalty));
  int64_t v = 0;
  bool present = false;
  MR_RETURN_IF_ERROR(integer(body, "top_k", v, present));
  if (present) p.top_k = static_cast<int>(v);
  MR_RETURN_IF_ERROR(integer(body, "n", v, present));
  if (present) p.n = static_cast<int>(std::min<int64_t>(v, 1 << 20));
  MR_RETURN_IF_ERROR(integer(body, "seed", v, present));
  if (present) p.seed = static_cast<uint64_t>(v);
  // max_completion_tokens is the newer OpenAI name; it wins when both are given.
  MR_RETURN_IF_ERROR(integer(body, "max_tokens", v, present));
  if (present) {
    if (v < 1) return invalid_argument("max_tokens: must be at least 1, got " + std::to_string(v));
    p.max_tokens = static_cast<int>(std::min<int64_t>(v, INT32_MAX));
  }
  MR_RETURN_IF_ERROR(integer(body, "max_completion_tokens", v, present));
  if (present) {
    if (v < 1) return invalid_argument("max_completion_tokens: must be at least 1, got " + std::to_string(v));
    p.max_tokens = static_cast<int>(std::min<int64_t>(v, INT32_MAX));
  }
  MR_RETURN_IF_ERROR(boolean(body, "ignore_eos", p.ignore_eos));
  MR_RETURN_IF_ERROR(boolean(body, "skip_special_tokens", p.skip_special_tokens));
  MR_RETURN_IF_ERROR(boolean(body, "include_stop_str_in_output", p.include_stop_str_in_output));

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return invalid_argument("stop: expected a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return invalid_argument("stop: expected a string or an array of strings");
    }
    if (p.stop.size() > 16) return invalid_argument("stop: at most 16 stop strings");
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_argument("stop_token_ids: expected an array of integers");
    for (const auto& t : *it) {
      if (!t.is_number_integer()) return invalid_argument("stop_token_ids: expected an array of integers");
      if (t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return invalid_argument("stop_token_ids: " + t.dump() + " is not a token id");
      p.stop_token_ids.push_back(t.get<int32_t>());
    }
  }

  // logit_bias: {"token id": bias in [-100, 100]}, as OpenAI spells it.
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument("logit_bias: expected an object mapping token ids to biases");
    for (const auto& [key, value] : it->items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX)
        return invalid_argument("logit_bias: key '" + key + "' is not a token id");
      if (!value.is_number()) return invalid_argument("logit_bias[" + key + "]: expected a number, got " + value.type_name());
      const double bias = value.get<double>();
      if (!(bias >= -100.0 && bias <= 100.0))
        return invalid_argument("logit_bias[" + key + "]: must be in [-100, 100]");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
    }
  }
  MR_RETURN_IF_ERROR(integer(body, "min_tokens", v, present));
  if (present) {
    if (v < 0) return invalid_argument("min_tokens: must be >= 0, got " + std::to_string(v));
    p.min_tokens = static_cast<int>(std::min<int64_t>(v, INT32_MAX));
  }

  if (endpoint == Endpoint::kChat) {
    bool want = false;
    MR_RETURN_IF_ERROR(boolean(body, "logprobs", want));
    MR_RETURN_IF_ERROR(integer(body, "top_logprobs", v, present));
    if (present && (v < 0 || v > 20)) return invalid_argument("top_logprobs: must be in [0, 20], got " + std::to_string(v));
    if (present && !want) return invalid_argument("top_logprobs: requires logprobs to be true");
    if (want) p.logprobs = present ? static_cast<int>(v) : 0;
  } else {
    MR_RETURN_IF_ERROR(integer(body, "logprobs", v, present));
    if (present) {
      if (v < 0 || v > 20) return invalid_argument("logprobs: must be in [0, 20], got " + std::to_string(v));
      p.logprobs = static_cast<int>(v);
    }
  }
  if (p.max_tokens > 0 && p.min_tokens > p.max_tokens)
    return invalid_argument("min_tokens: must not exceed max_tokens (" + std::to_string(p.min_tokens) + " > " +
                            std::to_string(p.max_tokens) + ")");
  Status st = p.validate();
  if (!st.is_ok()) return st;
  return p;
}

Status check_token_ids(const SamplingParams& params, int64_t vocab) {
  for (const auto& [token, _] : params.logit_bias)
    if (token >= vocab)
      return invalid_argument("logit_bias: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  for (int32_t token : params.stop_token_ids)
    if (token >= vocab)
      return invalid_argument("stop_token_ids: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  return Status::ok();
}

}  // namespace moonrun::server
