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

// Tools the API runs itself (OpenAI's hosted tools) or whose calls are items of their own
// kind: nothing here can run them or emit those items, so the model is not shown them.
bool hosted_tool(const std::string& type) {
  static const char* kHosted[] = {"web_search", "web_search_preview", "web_search_2025_08_26",
                                  "web_search_preview_2025_03_11", "file_search", "code_interpreter",
                                  "computer", "computer_use", "computer_use_preview", "image_generation",
                                  "mcp", "local_shell", "shell", "apply_patch", "tool_search"};
  for (const char* h : kHosted)
    if (type == h) return true;
  return false;
}

// One function tool (top level or inside a namespace) as a chat tool.
Result<Json> function_tool(const Json& t, const std::string& p) {
  if (!t.contains("name") || !t["name"].is_string()) return bad(p + ".name", "expected a string");
  Json fn = Json::object();
  fn["name"] = t["name"];
  if (t.contains("description") && !t["description"].is_null()) fn["description"] = t["description"];
  if (t.contains("parameters") && !t["parameters"].is_null()) fn["parameters"] = t["parameters"];
  return Json{{"type", "function"}, {"function", fn}};
}

Status convert_tools(const Json& tools, Json& out, ResponsesRequest& req) {
  if (!tools.is_array()) return bad("tools", "expected an array");
  std::map<std::string, std::string> where;  // tool name -> the path that declared it
  auto add = [&](const Json& t, const std::string& p, const std::string& ns) -> Status {
    Json tool = MR_TRY(function_tool(t, p));
    const std::string name = t["name"].get<std::string>();
    if (auto seen = where.find(name); seen != where.end())
      return bad(p + ".name", "'" + name + "' is also declared at " + seen->second +
                                  " (namespaces are flattened: their tools' names must be unique)");
    where[name] = p;
    if (!ns.empty()) req.tool_namespace[name] = ns;
    out.push_back(std::move(tool));
    return Status::ok();
  };
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad(p, "expected an object");
    const std::string type = t.value("type", "");
    if (type == "function") {
      MR_RETURN_IF_ERROR(add(t, p, ""));
    } else if (type == "namespace") {
      if (!t.contains("name") || !t["name"].is_string()) return bad(p + ".name", "expected a string");
      const Json inner = t.value("tools", Json::array());
      if (!inner.is_array()) return bad(p + ".tools", "expected an array");
      for (size_t k = 0; k < inner.size(); ++k) {
        const std::string q = p + ".tools[" + std::to_string(k) + "]";
        if (!inner[k].is_object() || inner[k].value("type", "") != "function")
          return bad(q + ".type", "only \"function\" tools are supported inside a namespace");
        MR_RETURN_IF_ERROR(add(inner[k], q, t["name"].get<std::string>()));
      }
    } else if (hosted_tool(type)) {
      req.dropped_tools.push_back(p + " (" + type + ")");
    } else {
      return bad(p + ".type", "unsupported tool type '" + type + "' (function and namespace tools are served; "
                              "hosted tools are not shown to the model)");
    }
  }
  return Status::ok();
}

Result<Json> convert_tool_choice(const Json& tc) {
  if (tc.is_string()) return tc;
  if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string())
    return Json{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  return bad("tool_choice", "expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

// The request's input as items: a string is one user message; item_reference items are
// replaced by the stored items they name.
Result<Json> input_items(const Json& input, ResponseStore* store) {
  if (input.is_string())
    return Json::array({Json{{"type", "message"}, {"role", "user"},
                             {"content", Json::array({Json{{"type", "input_text"}, {"text", input}}})}}});
  if (!input.is_array()) return bad("input", "expected a string or an array of input items");
  Json out = Json::array();
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    if (!item.is_object() || item.value("type", "") != "item_reference") {
      out.push_back(item);
      continue;
    }
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!item.contains("id") || !item["id"].is_string()) return bad(p + ".id", "expected a string");
    const std::string id = item["id"].get<std::string>();
    auto found = store ? store->item(id) : std::nullopt;
    if (!found)
      return bad(p + ".id", "no stored item '" + id + "': this server keeps the items of its last " +
                                std::to_string(ResponseStore::kMaxResponses) +
                                " responses made with store: true, until it restarts; send the item itself");
    out.push_back(std::move(*found));
  }
  return out;
}

// input: the whole conversation; its first `previous` items came from previous_response_id.
Result<Json> convert_input(const Json& input, size_t previous, const std::map<std::string, std::string>& tool_namespace) {
  Json messages = Json::array();
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
    const std::string p = i < previous ? "previous_response_id: item " + std::to_string(i)
                                       : "input[" + std::to_string(i - previous) + "]";
    if (!item.is_object()) return bad(p, "expected an object");
    std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "";
    if (type.empty() && item.contains("role")) type = "message";
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) return bad(p + ".role", "expected a string");
      const std::string role = item["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(p + ".role", "unknown role '" + role + "' (user, assistant, system, developer)");
      const Json content = item.value("content", Json());
      // The Responses API's developer messages are the developer's instructions (Codex sends
      // its whole system prompt as one): the chat format's system messages.
      Json msg = {{"role", role == "developer" ? "system" : role},
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
      // A call to a namespaced tool names its namespace apart; the tool's flattened name is its own.
      if (item.contains("namespace") && item["namespace"].is_string()) {
        auto ns = tool_namespace.find(item["name"].get<std::string>());
        if (ns != tool_namespace.end() && ns->second != item["namespace"].get<std::string>())
          return bad(p + ".namespace", "'" + item["name"].get<std::string>() + "' is declared in namespace '" +
                                           ns->second + "'");
      }
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

Result<ResponsesRequest> responses_to_chat(const Json& body, ResponseStore* store) {
  if (!body.is_object()) return bad("request", "expected a JSON object");
  for (const char* unsupported : {"conversation", "prompt"})
    if (body.contains(unsupported) && !body[unsupported].is_null())
      return bad(unsupported, "not supported: this server keeps no conversations or prompts; send the input "
                              "(previous_response_id continues a stored response)");
  if (body.contains("background") && body["background"] == true)
    return bad("background", "not supported: responses are answered while the request waits (or streamed)");
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
  if (auto it = body.find("store"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("store", "expected true or false");
    out.store = it->get<bool>();
  }
  if (auto it = body.find("previous_response_id"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad("previous_response_id", "expected a string");
    out.previous_response_id = it->get<std::string>();
    auto previous = store ? store->conversation(out.previous_response_id) : std::nullopt;
    if (!previous)  // OpenAI's text, and why
      return bad("previous_response_id", "Previous response with id '" + out.previous_response_id +
                                             "' not found. This server keeps its last " +
                                             std::to_string(ResponseStore::kMaxResponses) +
                                             " responses made with store: true, until it restarts.");
    out.input_items = std::move(*previous);
  }
  if (!body.contains("input")) return bad("input", "missing");

  Json tools = Json::array();
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    out.tools = *it;
    MR_RETURN_IF_ERROR(convert_tools(*it, tools, out));
    if (!tools.empty()) chat["tools"] = tools;
  }
  const size_t previous = out.input_items.size();
  for (Json& item : MR_TRY(input_items(body["input"], store))) out.input_items.push_back(std::move(item));
  for (Json& m : MR_TRY(convert_input(out.input_items, previous, out.tool_namespace))) messages.push_back(std::move(m));
  chat["messages"] = std::move(messages);
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
    if (auto sm = it->find("summary"); sm != it->end()) out.reasoning_summary = *sm;
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
