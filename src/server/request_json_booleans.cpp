// Every boolean field of every route, checked in one place before any handler reads the
// body (parse_body): a field a client sets to "yes", 1 or {} is a 400 naming it, whether
// moonrun acts on the field or only accepts it (vLLM's pydantic models refuse such values
// for the same fields; an ignored field that took any value would hide a client's mistake).
//
// The lists: OpenAI's request bodies, vLLM's extensions of them (ChatCompletionRequest,
// CompletionRequest, TokenizeRequest in vllm/entrypoints/openai), Anthropic's Messages
// body, and the chat template kwargs moonrun reads.
#include "server/request_json.h"

#include <map>

namespace moonrun::server {
namespace {

using nlohmann::json;

std::vector<std::string> join(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const std::map<std::string_view, std::vector<std::string>>& table() {
  // What every route that renders a chat reads through chat_template_kwargs.
  const std::vector<std::string> template_kwargs = {"chat_template_kwargs.thinking", "chat_template_kwargs.enable_thinking",
                                                    "chat_template_kwargs.add_generation_prompt"};
  // vLLM's sampling and output extensions, the same on chat and completions.
  const std::vector<std::string> vllm_sampling = {
      "use_beam_search", "watermarking", "include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
      "spaces_between_special_tokens", "return_tokens_as_token_ids", "return_token_ids", "return_token_offsets",
      "return_mm_kwargs", "stream_options.include_usage", "stream_options.continuous_usage_stats",
      "stream_options.include_obfuscation"};
  static const std::map<std::string_view, std::vector<std::string>> t = {
      {"/v1/chat/completions",
       join({{"stream", "logprobs", "parallel_tool_calls", "store", "include_reasoning", "echo", "add_generation_prompt",
              "continue_final_message", "add_special_tokens", "return_prompt_text"},
             vllm_sampling, template_kwargs,
             {"tools[].function.strict", "tools[].defer_loading", "tools[].function.defer_loading",
              "response_format.json_schema.strict"}})},
      {"/v1/completions", join({{"stream", "echo", "add_special_tokens"}, vllm_sampling})},
      {"/v1/responses",
       {"stream", "store", "background", "parallel_tool_calls", "stream_options.include_obfuscation", "tools[].strict",
        "tools[].defer_loading", "text.format.strict"}},
      {"/v1/messages", {"stream", "tool_choice.disable_parallel_tool_use", "tools[].strict", "tools[].defer_loading"}},
      {"/tokenize",
       join({{"add_generation_prompt", "continue_final_message", "add_special_tokens", "return_token_strs"},
             template_kwargs, {"tools[].function.strict"}})},
      {"/detokenize", {}},
  };
  return t;
}

// Walks `path` ("a.b", "a[].b") from `v`; `where` is the path with indices so far.
std::optional<FieldError> check_path(const json& v, std::string_view path, const std::string& where) {
  const size_t dot = path.find('.');
  std::string_view key = path.substr(0, dot);
  const std::string_view rest = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  const bool each = key.size() > 2 && key.substr(key.size() - 2) == "[]";
  if (each) key.remove_suffix(2);
  if (!v.is_object()) return std::nullopt;  // the route's own checks name a wrong container
  auto it = v.find(std::string(key));
  if (it == v.end() || it->is_null()) return std::nullopt;
  const std::string here = where.empty() ? std::string(key) : where + "." + std::string(key);
  if (each) {
    if (!it->is_array()) return std::nullopt;
    for (size_t i = 0; i < it->size(); ++i)
      if (auto e = check_path((*it)[i], rest, here + "[" + std::to_string(i) + "]")) return e;
    return std::nullopt;
  }
  if (!rest.empty()) return check_path(*it, rest, here);
  if (it->is_boolean()) return std::nullopt;
  return FieldError{here, here + ": expected true or false, got " + std::string(it->type_name())};
}

}  // namespace

const std::vector<std::string>& boolean_fields(std::string_view route) {
  static const std::vector<std::string> none;
  auto it = table().find(route);
  return it == table().end() ? none : it->second;
}

std::optional<FieldError> check_boolean_fields(const json& body, std::string_view route) {
  for (const std::string& path : boolean_fields(route))
    if (auto e = check_path(body, path, "")) return e;
  return std::nullopt;
}

}  // namespace moonrun::server
