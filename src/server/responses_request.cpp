// Responses API request -> chat body; see responses_request.h.
#include "server/responses_request.h"

namespace moonrun::server {
namespace {

using chat::Json;

Status bad(const std::string& path, const std::string& problem) { return invalid_argument(path + ": " + problem); }

// One text-like content part's text.
Result<std::string> part_text(const Json& part, const std::string& p) {
  if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
    return bad(p + ".type", "expected a string");
  const std::string type = part["type"].get<std::string>();
  if (type == "input_text" || type == "output_text" || type == "text" || type == "reasoning_text" ||
      type == "summary_text" || type == "refusal") {
    const char* key = type == "refusal" ? "refusal" : "text";
    if (!part.contains(key) || !part[key].is_string()) return bad(p + "." + key, "expected a string");
    return part[key].get<std::string>();
  }
  if (type == "input_image") return bad(p, "input_image parts are taken in user messages only");
  if (type == "input_file" || type == "input_audio")
    return unimplemented(p + ": " + type + " inputs are not supported by this server's model");
  return bad(p + ".type", "unknown content part type '" + type + "'");
}

// The text of a content value: a string, or an array of text parts.
Result<std::string> content_text(const Json& content, const std::string& path) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad(path, "expected a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) out += MR_TRY(part_text(content[i], path + "[" + std::to_string(i) + "]"));
  return out;
}

// A user message's content as the chat body takes it: its text, or - when it holds
// input_image parts - the chat API's text and image_url parts in their order (the chat
// pipeline then decodes, checks and bills the images as it does for chat requests).
Result<Json> user_content(const Json& content, const std::string& path) {
  bool images = false;
  if (content.is_array())
    for (const Json& part : content) images = images || (part.is_object() && part.value("type", "") == "input_image");
  if (!images) return Json(MR_TRY(content_text(content, path)));
  Json parts = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (part.value("type", "") != "input_image") {
      parts.push_back(Json{{"type", "text"}, {"text", MR_TRY(part_text(part, p))}});
      continue;
    }
    if (part.contains("file_id") && !part["file_id"].is_null())
      return bad(p + ".file_id", "this server stores no files: send the image as a data: URI in image_url");
    if (!part.contains("image_url") || !part["image_url"].is_string())
      return bad(p + ".image_url", "expected a string (a data: URI)");
    parts.push_back(Json{{"type", "image_url"}, {"image_url", {{"url", part["image_url"]}}}});
  }
  return parts;
}

Result<Json> convert_tools(const Json& tools) {
  if (!tools.is_array()) return bad("tools", "expected an array");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad(p, "expected an object");
    const std::string type = t.value("type", "");
    if (type != "function") return bad(p + ".type", "only \"function\" tools are supported, got '" + type + "'");
    if (!t.contains("name") || !t["name"].is_string()) return bad(p + ".name", "expected a string");
    Json fn = Json::object();
    fn["name"] = t["name"];
    if (t.contains("description") && !t["description"].is_null()) fn["description"] = t["description"];
    if (t.contains("parameters") && !t["parameters"].is_null()) fn["parameters"] = t["parameters"];
    out.push_back(Json{{"type", "function"}, {"function", fn}});
  }
  return out;
}

Result<Json> convert_tool_choice(const Json& tc) {
  if (tc.is_string()) return tc;
  if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string())
    return Json{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  return bad("tool_choice", "expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

Result<Json> convert_input(const Json& input) {
  Json messages = Json::array();
  if (input.is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) return bad("input", "expected a string or an array of input items");
  std::string pending_reasoning;
  bool have_reasoning = false;
  // The assistant message the next function_call joins: the one just added, as long as
  // nothing else came after it.
  long open_assistant = -1;
  auto take_reasoning = [&](Json& msg) {
    if (have_reasoning) msg["reasoning_content"] = pending_reasoning;
    pending_reasoning.clear();
    have_reasoning = false;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad(p, "expected an object");
    std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "";
    if (type.empty() && item.contains("role")) type = "message";
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) return bad(p + ".role", "expected a string");
      const std::string role = item["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(p + ".role", "unknown role '" + role + "' (user, assistant, system, developer)");
      const Json content = item.value("content", Json());
      Json msg = {{"role", role},
                  {"content", role == "user" ? MR_TRY(user_content(content, p + ".content"))
                                             : Json(MR_TRY(content_text(content, p + ".content")))}};
      if (role == "assistant") take_reasoning(msg);
      messages.push_back(std::move(msg));
      open_assistant = role == "assistant" ? static_cast<long>(messages.size()) - 1 : -1;
    } else if (type == "reasoning") {
      std::string text;
      if (item.contains("content") && item["content"].is_array() && !item["content"].empty())
        text = MR_TRY(content_text(item["content"], p + ".content"));
      else if (item.contains("summary") && item["summary"].is_array())
        text = MR_TRY(content_text(item["summary"], p + ".summary"));
      pending_reasoning += text;
      have_reasoning = true;
      open_assistant = -1;
    } else if (type == "function_call") {
      for (const char* key : {"call_id", "name"})
        if (!item.contains(key) || !item[key].is_string()) return bad(p + "." + key, "expected a string");
      Json args = item.value("arguments", Json("{}"));
      if (!args.is_string()) return bad(p + ".arguments", "expected a string holding a JSON object");
      if (open_assistant < 0) {
        Json msg = {{"role", "assistant"}, {"content", ""}};
        take_reasoning(msg);
        messages.push_back(std::move(msg));
        open_assistant = static_cast<long>(messages.size()) - 1;
      }
      Json& msg = messages[open_assistant];
      if (!msg.contains("tool_calls")) msg["tool_calls"] = Json::array();
      msg["tool_calls"].push_back(Json{{"id", item["call_id"]}, {"type", "function"},
                                       {"function", {{"name", item["name"]}, {"arguments", args}}}});
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) return bad(p + ".call_id", "expected a string");
      const Json output = item.value("output", Json(""));
      messages.push_back(Json{{"role", "tool"}, {"tool_call_id", item["call_id"]},
                              {"content", MR_TRY(content_text(output, p + ".output"))}});
      open_assistant = -1;
    } else {
      return bad(p + ".type", "unsupported input item type '" + type + "'");
    }
  }
  return messages;
}

}  // namespace

Result<ResponsesRequest> responses_to_chat(const Json& body) {
  if (!body.is_object()) return bad("request", "expected a JSON object");
  for (const char* unsupported : {"previous_response_id", "conversation", "prompt"})
    if (body.contains(unsupported) && !body[unsupported].is_null())
      return bad(unsupported, "not supported: this server stores no responses; send the whole conversation as input");
  if (body.contains("n") && !(body["n"].is_number_integer() && body["n"] == 1))
    return bad("n", "the Responses API generates one response");
  ResponsesRequest out;
  Json chat = Json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  Json messages = Json::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad("instructions", "expected a string");
    out.instructions = it->get<std::string>();
    messages.push_back(Json{{"role", "system"}, {"content", *it}});
  }
  if (!body.contains("input")) return bad("input", "missing");
  for (Json& m : MR_TRY(convert_input(body["input"]))) messages.push_back(std::move(m));
  chat["messages"] = std::move(messages);

  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    out.tools = *it;
    Json tools = MR_TRY(convert_tools(*it));
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    out.tool_choice = *it;
    chat["tool_choice"] = MR_TRY(convert_tool_choice(*it));
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) chat["parallel_tool_calls"] = *it;
  if (auto it = body.find("text"); it != body.end() && it->is_object() && it->contains("format")) {
    const Json& f = (*it)["format"];
    out.text_format = f;
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) return bad("text.format.type", "expected a string");
    const std::string type = f["type"].get<std::string>();
    if (type == "json_object") {
      chat["response_format"] = Json{{"type", "json_object"}};
    } else if (type == "json_schema") {
      Json js = Json::object();
      for (const char* key : {"name", "description", "schema", "strict"})
        if (f.contains(key)) js[key] = f[key];
      chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", js}};
    } else if (type != "text") {
      return bad("text.format.type", "unknown format '" + type + "' (text, json_object, json_schema)");
    }
  }
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("reasoning", "expected an object");
    if (auto e = it->find("effort"); e != it->end() && !e->is_null()) {
      if (!e->is_string()) return bad("reasoning.effort", "expected a string");
      out.reasoning_effort = e->get<std::string>();
      chat["reasoning_effort"] = *e;
    }
  }
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) chat["max_tokens"] = *it;
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                          "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "stop_token_ids",
                          "ignore_eos", "chat_template_kwargs"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) chat[key] = *it;
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("stream", "expected true or false");
    out.stream = it->get<bool>();
  }
  out.chat_body = std::move(chat);
  return out;
}

}  // namespace moonrun::server
