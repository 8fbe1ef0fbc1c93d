// Anthropic Messages request -> chat body; see messages_request.h.
#include "server/messages_request.h"

#include <map>

#include "server/image_input.h"

namespace moonrun::server {
namespace {

using chat::Json;

Status bad(const std::string& path, const std::string& problem) { return invalid_argument(path + ": " + problem); }

std::string type_of(const Json& block) {
  return block.is_object() && block.contains("type") && block["type"].is_string() ? block["type"].get<std::string>() : "";
}

// "mrthink1." + base64: the prefix tells our own signatures from another provider's.
constexpr std::string_view kSignaturePrefix = "mrthink1.";

std::string base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// The reasoning a thinking block carries: its text, else what our signature holds (display
// "omitted" sent it without text). Another provider's signature means nothing here.
std::string thinking_of(const Json& b) {
  if (b.contains("thinking") && b["thinking"].is_string() && !b["thinking"].get<std::string>().empty())
    return b["thinking"].get<std::string>();
  if (!b.contains("signature") || !b["signature"].is_string()) return "";
  const std::string sig = b["signature"].get<std::string>();
  if (sig.compare(0, kSignaturePrefix.size(), kSignaturePrefix) != 0) return "";
  auto bytes = decode_base64(std::string_view(sig).substr(kSignaturePrefix.size()), sig.size());
  return bytes.is_ok() ? std::string(bytes->begin(), bytes->end()) : "";
}

// Text of a string or of an array of text blocks (system prompts).
Result<std::string> text_of(const Json& v, const std::string& path) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return bad(path, "expected a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    const std::string t = type_of(v[i]);
    if (t == "image" || t == "document")
      return unimplemented(p + ": " + t + " blocks are not supported here by this server's model");
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

// The request's tools: shown ones (the chat body's tools) and deferred ones by name.
struct Tools {
  Json shown = Json::array();
  std::map<std::string, Json> deferred;  // name -> chat tool
};

// A tool_result's content: its text, and the deferred tools its tool_reference blocks load.
Status tool_result(const Json& b, const std::string& p, const Tools& tools, Json& messages) {
  if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return bad(p + ".tool_use_id", "expected a string");
  const Json content = b.value("content", Json(""));
  std::string text;
  Json loaded = Json::array();
  if (content.is_array()) {
    for (size_t i = 0; i < content.size(); ++i) {
      const std::string q = p + ".content[" + std::to_string(i) + "]";
      const std::string t = type_of(content[i]);
      if (t == "tool_reference") {
        const std::string name = content[i].value("tool_name", "");
        auto it = tools.deferred.find(name);
        if (it == tools.deferred.end()) return bad(q + ".tool_name", "'" + name + "' is not a deferred tool of this request");
        loaded.push_back(it->second);
      } else if (t == "text") {
        if (!content[i].contains("text") || !content[i]["text"].is_string()) return bad(q + ".text", "expected a string");
        text += content[i]["text"].get<std::string>();
      } else {
        return unimplemented(q + ": '" + t + "' blocks in a tool_result are not supported by this server's model");
      }
    }
  } else {
    text = MR_TRY(text_of(content, p + ".content"));
  }
  messages.push_back(Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", text}});
  // The chat format's mid-conversation tool declaration: callable from here on.
  if (!loaded.empty()) messages.push_back(Json{{"role", "system"}, {"content", ""}, {"tools", loaded}});
  return Status::ok();
}

Status add_message(const Json& m, const std::string& path, const Tools& tools, Json& messages) {
  if (!m.is_object()) return bad(path, "expected an object");
  if (!m.contains("role") || !m["role"].is_string()) return bad(path + ".role", "expected a string");
  const std::string role = m["role"].get<std::string>();
  if (!m.contains("content")) return bad(path + ".content", "missing");
  const Json& content = m["content"];
  if (role == "system") {  // a system turn where it stands (text only)
    messages.push_back(Json{{"role", "system"}, {"content", MR_TRY(text_of(content, path + ".content"))}});
    return Status::ok();
  }
  if (role != "user" && role != "assistant")
    return bad(path + ".role", "expected \"user\", \"assistant\" or \"system\", got '" + role + "'");
  if (content.is_string()) {
    messages.push_back(Json{{"role", role}, {"content", content}});
    return Status::ok();
  }
  if (!content.is_array()) return bad(path + ".content", "expected a string or an array of content blocks");
  std::string text, thinking;
  Json tool_calls = Json::array();
  // A user message with images keeps its blocks in order as chat parts (text, image_url).
  Json parts = Json::array();
  bool images = false, tool_results = false;
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
      MR_RETURN_IF_ERROR(tool_result(b, p, tools, messages));
      tool_results = true;
    } else if (t == "thinking" && role == "assistant") {
      thinking += thinking_of(b);
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
    else if (!text.empty() || !tool_results)  // a turn of tool results alone adds no user message
      messages.push_back(Json{{"role", "user"}, {"content", text}});
    return Status::ok();
  }
  Json msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!tool_calls.empty()) msg["tool_calls"] = tool_calls;
  messages.push_back(std::move(msg));
  return Status::ok();
}

Result<Tools> convert_tools(const Json& given) {
  Tools out;
  if (given.is_null()) return out;
  if (!given.is_array()) return bad("tools", "expected an array");
  for (size_t i = 0; i < given.size(); ++i) {
    const Json& t = given[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad(p, "expected an object");
    const std::string type = type_of(t);
    if (!type.empty() && type != "custom")
      return bad(p + ".type", "Anthropic's server tools ('" + type + "') are not run by this server; declare client tools");
    if (!t.contains("name") || !t["name"].is_string()) return bad(p + ".name", "expected a string");
    Json fn = {{"name", t["name"]}};
    if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
    const Json schema = t.value("input_schema", Json{{"type", "object"}});
    if (!schema.is_object()) return bad(p + ".input_schema", "expected an object");
    fn["parameters"] = schema;
    Json tool = {{"type", "function"}, {"function", fn}};
    const Json defer = t.value("defer_loading", Json(false));
    if (!defer.is_boolean()) return bad(p + ".defer_loading", "expected true or false");
    if (defer.get<bool>()) out.deferred[t["name"].get<std::string>()] = std::move(tool);
    else out.shown.push_back(std::move(tool));
  }
  return out;
}

Status convert_tool_choice(const Json& tc, Json& chat) {
  const std::string type = type_of(tc);
  if (type == "auto") chat["tool_choice"] = "auto";
  else if (type == "any") chat["tool_choice"] = "required";
  else if (type == "none") chat["tool_choice"] = "none";
  else if (type == "tool" && tc.contains("name") && tc["name"].is_string())
    chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  else return bad("tool_choice", "expected {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
  if (auto it = tc.find("disable_parallel_tool_use"); it != tc.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("tool_choice.disable_parallel_tool_use", "expected true or false");
    chat["parallel_tool_calls"] = !it->get<bool>();
  }
  return Status::ok();
}

Status convert_thinking(const Json& thinking, Json& chat, MessagesRequest& out) {
  if (!thinking.is_object()) return bad("thinking", "expected an object");
  const std::string type = type_of(thinking);
  if (type == "disabled") chat["chat_template_kwargs"] = Json{{"thinking", false}};
  else if (type != "enabled" && type != "adaptive")
    return bad("thinking.type", "expected \"enabled\", \"adaptive\" or \"disabled\"");
  if (auto it = thinking.find("budget_tokens"); it != thinking.end() && !it->is_null() && !it->is_number_integer())
    return bad("thinking.budget_tokens", "expected an integer");
  if (auto it = thinking.find("display"); it != thinking.end() && !it->is_null()) {
    // "summarized", "updates", ...: the thinking is shown as it is (K3's is readable);
    // only "omitted" asks for it not to be.
    if (!it->is_string()) return bad("thinking.display", "expected a string (\"summarized\", \"omitted\", ...)");
    out.thinking_omitted = *it == "omitted";
  }
  return Status::ok();
}

// A JSON-schema output format as the chat route's response_format.
Result<Json> output_format(const Json& f, const std::string& path) {
  if (!f.is_object()) return bad(path, "expected an object");
  if (type_of(f) != "json_schema") return bad(path + ".type", "expected \"json_schema\"");
  if (!f.contains("schema") || !f["schema"].is_object()) return bad(path + ".schema", "expected an object");
  return Json{{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", f["schema"]}, {"strict", true}}}};
}

Status convert_output_config(const Json& oc, Json& chat) {
  if (!oc.is_object()) return bad("output_config", "expected an object");
  if (auto it = oc.find("effort"); it != oc.end() && !it->is_null()) {
    static const std::map<std::string, std::string> kEffort = {
        {"low", "low"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"}, {"max", "max"}};
    auto e = it->is_string() ? kEffort.find(it->get<std::string>()) : kEffort.end();
    if (e == kEffort.end()) return bad("output_config.effort", "expected \"low\", \"medium\", \"high\", \"xhigh\" or \"max\"");
    chat["reasoning_effort"] = e->second;
  }
  if (auto it = oc.find("format"); it != oc.end() && !it->is_null())
    chat["response_format"] = MR_TRY(output_format(*it, "output_config.format"));
  return Status::ok();
}

Status check_context_management(const Json& cm) {
  if (!cm.is_object()) return bad("context_management", "expected an object");
  const Json edits = cm.value("edits", Json::array());
  if (!edits.is_array()) return bad("context_management.edits", "expected an array");
  for (size_t i = 0; i < edits.size(); ++i)
    if (type_of(edits[i]).empty()) return bad("context_management.edits[" + std::to_string(i) + "].type", "expected a string");
  return Status::ok();
}

}  // namespace

std::string thinking_signature(const std::string& reasoning) {
  return reasoning.empty() ? "" : std::string(kSignaturePrefix) + base64(reasoning);
}

Status anthropic_fit_context(int64_t limit, size_t prompt_tokens, int& max_tokens) {
  const int64_t prompt = static_cast<int64_t>(prompt_tokens);
  if (prompt >= limit)
    return out_of_range("prompt is too long: " + std::to_string(prompt) + " tokens > " + std::to_string(limit - 1) +
                        " maximum");
  if (prompt + max_tokens > limit)
    return out_of_range("input length and `max_tokens` exceed context limit: " + std::to_string(prompt) + " + " +
                        std::to_string(max_tokens) + " > " + std::to_string(limit) +
                        ", decrease input length or `max_tokens` and try again");
  return Status::ok();
}

Result<MessagesRequest> messages_to_chat(const Json& body, MessagesRoute route) {
  if (!body.is_object()) return bad("request", "expected a JSON object");
  MessagesRequest out;
  Json chat = Json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  const Tools tools = MR_TRY(convert_tools(body.value("tools", Json())));
  Json messages = Json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null())
    messages.push_back(Json{{"role", "system"}, {"content", MR_TRY(text_of(*it, "system"))}});
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array()) return bad("messages", "expected an array");
  if (msgs->empty()) return bad("messages", "must contain at least one message");
  for (size_t i = 0; i < msgs->size(); ++i)
    MR_RETURN_IF_ERROR(add_message((*msgs)[i], "messages[" + std::to_string(i) + "]", tools, messages));
  chat["messages"] = std::move(messages);
  if (!tools.shown.empty()) chat["tools"] = tools.shown;

  auto max_tokens = body.find("max_tokens");
  if (route == MessagesRoute::kCreate) {
    if (max_tokens == body.end() || max_tokens->is_null()) return bad("max_tokens", "missing (the Messages API requires it)");
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1)
      return bad("max_tokens", "expected an integer of at least 1");
    chat["max_tokens"] = *max_tokens;
  }

  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null())
    MR_RETURN_IF_ERROR(convert_tool_choice(*it, chat));
  if (auto it = body.find("thinking"); it != body.end() && !it->is_null())
    MR_RETURN_IF_ERROR(convert_thinking(*it, chat, out));
  if (auto it = body.find("output_config"); it != body.end() && !it->is_null())
    MR_RETURN_IF_ERROR(convert_output_config(*it, chat));
  if (auto it = body.find("output_format"); it != body.end() && !it->is_null()) {  // the beta's name for it
    if (chat.contains("response_format")) return bad("output_format", "give output_config.format or output_format, not both");
    chat["response_format"] = MR_TRY(output_format(*it, "output_format"));
  }
  if (auto it = body.find("context_management"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(check_context_management(*it));
    out.context_management = true;
  }
  for (const char* key : {"mcp_servers", "container"})
    if (auto it = body.find(key); it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
      return bad(key, "not supported: this server runs no remote MCP servers or code containers");
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
