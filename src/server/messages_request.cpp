// Anthropic Messages request -> chat body; see messages_request.h.
#include "server/messages_request.h"

namespace moonrun::server {
namespace {

using chat::Json;

Status bad(const std::string& path, const std::string& problem) { return invalid_argument(path + ": " + problem); }

std::string type_of(const Json& block) {
  return block.is_object() && block.contains("type") && block["type"].is_string() ? block["type"].get<std::string>() : "";
}

// Text of a string or of an array of text blocks (system prompts, tool results).
Result<std::string> text_of(const Json& v, const std::string& path) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return bad(path, "expected a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    const std::string t = type_of(v[i]);
    if (t == "image" || t == "document")
      return unimplemented(p + ": " + t + " blocks are not supported by this server's model yet");
    if (t != "text") return bad(p + ".type", "expected \"text\", got '" + t + "'");
    if (!v[i].contains("text") || !v[i]["text"].is_string()) return bad(p + ".text", "expected a string");
    out += v[i]["text"].get<std::string>();
  }
  return out;
}

// An image block's source as the URL the chat API takes: base64 data as a data: URI, a
// url source as it is (the chat pipeline decides what it accepts).
Result<std::string> image_url_of(const Json& block, const std::string& p) {
  const Json source = block.value("source", Json());
  if (!source.is_object()) return bad(p + ".source", "expected an object");
  const std::string type = source.value("type", "");
  if (type == "base64") {
    for (const char* key : {"media_type", "data"})
      if (!source.contains(key) || !source[key].is_string()) return bad(p + ".source." + key, "expected a string");
    return "data:" + source["media_type"].get<std::string>() + ";base64," + source["data"].get<std::string>();
  }
  if (type == "url") {
    if (!source.contains("url") || !source["url"].is_string()) return bad(p + ".source.url", "expected a string");
    return source["url"].get<std::string>();
  }
  return bad(p + ".source.type", "expected \"base64\" or \"url\", got '" + type + "'");
}

Status add_message(const Json& m, const std::string& path, Json& messages) {
  if (!m.is_object()) return bad(path, "expected an object");
  if (!m.contains("role") || !m["role"].is_string()) return bad(path + ".role", "expected a string");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant") return bad(path + ".role", "expected \"user\" or \"assistant\", got '" + role + "'");
  if (!m.contains("content")) return bad(path + ".content", "missing");
  const Json& content = m["content"];
  if (content.is_string()) {
    messages.push_back(Json{{"role", role}, {"content", content}});
    return Status::ok();
  }
  if (!content.is_array()) return bad(path + ".content", "expected a string or an array of content blocks");
  std::string text, thinking;
  Json tool_calls = Json::array();
  // A user message with images keeps its blocks in order as chat parts (text, image_url).
  Json parts = Json::array();
  bool images = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string p = path + ".content[" + std::to_string(i) + "]";
    const std::string t = type_of(b);
    if (t == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return bad(p + ".text", "expected a string");
      text += b["text"].get<std::string>();
      parts.push_back(Json{{"type", "text"}, {"text", b["text"]}});
    } else if (t == "image" && role == "user") {
      parts.push_back(Json{{"type", "image_url"}, {"image_url", {{"url", MR_TRY(image_url_of(b, p))}}}});
      images = true;
    } else if (t == "image" || t == "document") {
      return unimplemented(p + ": " + t + " blocks are taken in user messages only, and documents not at all");
    } else if (t == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return bad(p + ".tool_use_id", "expected a string");
      std::string result = MR_TRY(text_of(b.value("content", Json("")), p + ".content"));
      messages.push_back(Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else if (t == "thinking" && role == "assistant") {
      if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
    } else if (t == "redacted_thinking" && role == "assistant") {
      // Encrypted by another provider: nothing this model can read back.
    } else if (t == "tool_use" && role == "assistant") {
      for (const char* key : {"id", "name"})
        if (!b.contains(key) || !b[key].is_string()) return bad(p + "." + key, "expected a string");
      const Json input = b.value("input", Json::object());
      if (!input.is_object()) return bad(p + ".input", "expected an object");
      tool_calls.push_back(Json{{"id", b["id"]}, {"type", "function"},
                                {"function", {{"name", b["name"]}, {"arguments", input}}}});
    } else {
      return bad(p + ".type", "unsupported content block '" + t + "' in a " + role + " message");
    }
  }
  if (role == "user") {
    if (images) messages.push_back(Json{{"role", "user"}, {"content", parts}});
    else if (!text.empty() || messages.empty() || messages.back()["role"] != "tool")
      messages.push_back(Json{{"role", "user"}, {"content", text}});
    return Status::ok();
  }
  Json msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!tool_calls.empty()) msg["tool_calls"] = tool_calls;
  messages.push_back(std::move(msg));
  return Status::ok();
}

}  // namespace

Result<MessagesRequest> messages_to_chat(const Json& body) {
  if (!body.is_object()) return bad("request", "expected a JSON object");
  MessagesRequest out;
  Json chat = Json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  Json messages = Json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null())
    messages.push_back(Json{{"role", "system"}, {"content", MR_TRY(text_of(*it, "system"))}});
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array()) return bad("messages", "expected an array");
  if (msgs->empty()) return bad("messages", "must contain at least one message");
  for (size_t i = 0; i < msgs->size(); ++i)
    MR_RETURN_IF_ERROR(add_message((*msgs)[i], "messages[" + std::to_string(i) + "]", messages));
  chat["messages"] = std::move(messages);

  auto max_tokens = body.find("max_tokens");
  if (max_tokens == body.end() || max_tokens->is_null()) return bad("max_tokens", "missing (the Messages API requires it)");
  chat["max_tokens"] = *max_tokens;

  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return bad("tools", "expected an array");
    Json tools = Json::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& t = (*it)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return bad(p, "expected an object");
      const std::string type = type_of(t);
      if (!type.empty() && type != "custom") return bad(p + ".type", "server tools ('" + type + "') are not supported");
      if (!t.contains("name") || !t["name"].is_string()) return bad(p + ".name", "expected a string");
      Json fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      fn["parameters"] = t.value("input_schema", Json{{"type", "object"}});
      tools.push_back(Json{{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    const std::string type = type_of(*it);
    if (type == "auto") chat["tool_choice"] = "auto";
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "none") chat["tool_choice"] = "none";
    else if (type == "tool" && it->contains("name") && (*it)["name"].is_string())
      chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
    else return bad("tool_choice", "expected {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
    if (it->contains("disable_parallel_tool_use") && (*it)["disable_parallel_tool_use"].is_boolean())
      chat["parallel_tool_calls"] = !(*it)["disable_parallel_tool_use"].get<bool>();
  }
  if (auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
    const std::string type = type_of(*it);
    if (type == "disabled") chat["chat_template_kwargs"] = Json{{"thinking", false}};
    else if (type != "enabled" && type != "adaptive")
      return bad("thinking.type", "expected \"enabled\", \"adaptive\" or \"disabled\"");
  }
  if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return bad("stop_sequences", "expected an array of strings");
    for (const Json& s : *it) {
      if (!s.is_string()) return bad("stop_sequences", "expected an array of strings");
      out.stop_sequences.push_back(s.get<std::string>());
    }
    chat["stop"] = *it;
  }
  for (const char* key : {"temperature", "top_p", "top_k"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) chat[key] = *it;
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("stream", "expected true or false");
    out.stream = it->get<bool>();
  }
  out.chat_body = std::move(chat);
  return out;
}

}  // namespace moonrun::server
