// Parsed messages, tool-call ids, and the parser factory.
#include "chat/parse_message.h"

#include <cstdio>

#include "chat/chat_request.h"
#include "chat/parse_k2.h"
#include "chat/parse_k3.h"

namespace moonrun::chat {

void ParsedMessage::append(const ParseDelta& delta) {
  reasoning += delta.reasoning;
  content += delta.content;
  tool_calls.insert(tool_calls.end(), delta.tool_calls.begin(), delta.tool_calls.end());
}

Json ParsedMessage::to_json() const {
  Json out = Json::object();
  out["reasoning_content"] = reasoning.empty() ? Json(nullptr) : Json(reasoning);
  out["content"] = content.empty() ? Json(nullptr) : Json(content);
  out["tool_calls"] = Json::array();
  for (const auto& tc : tool_calls) {
    Json call = Json::object();
    call["id"] = tc.id;
    call["type"] = "function";
    call["function"] = Json::object();
    call["function"]["name"] = tc.name;
    call["function"]["arguments"] = tc.arguments;
    out["tool_calls"].push_back(std::move(call));
  }
  return out;
}

ToolCallIds::ToolCallIds(std::optional<uint64_t> seed) : rng_(seed ? *seed : std::random_device{}()) {
  if (!seed) rng_.seed((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
}

std::string ToolCallIds::next() {
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return std::string("chatcmpl-tool-") + hex;
}

ParseOptions parse_options_for(const ChatRequest& request) {
  ParseOptions o;
  o.thinking = request.thinking;
  const bool declared = request.tools.is_array() && !request.tools.empty();
  o.tool_calls_allowed = declared && request.tool_choice.kind != ToolChoice::Kind::kNone;
  o.parallel_tool_calls = request.parallel_tool_calls;
  if (!declared) return o;
  for (const Json& t : request.tools) {
    const Json& fn = t["function"];  // checked by parse_chat_request
    DeclaredTool d;
    d.name = fn["name"].get<std::string>();
    if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("properties") &&
        fn["parameters"]["properties"].is_object())
      for (const auto& [key, _] : fn["parameters"]["properties"].items()) d.properties.push_back(key);
    o.tools.push_back(std::move(d));
  }
  return o;
}

std::unique_ptr<CompletionParser> make_completion_parser(ChatFormat format, const ParseOptions& options) {
  return format == ChatFormat::kKimiK3 ? make_k3_parser(options) : make_k2_parser(options);
}

ParsedMessage parse_completion(ChatFormat format, std::string_view text, const ParseOptions& options) {
  auto parser = make_completion_parser(format, options);
  ParsedMessage out;
  out.append(parser->feed(text));
  out.append(parser->finish());
  return out;
}

}  // namespace moonrun::chat
