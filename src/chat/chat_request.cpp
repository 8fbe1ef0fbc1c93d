// Parsing an OpenAI chat-completions body into ChatRequest. Each check names the field it
// rejects, with its index path, so a client can find the problem in its own request.
#include "chat/chat_request.h"

#include <cmath>

#include "common/log.h"

namespace moonrun::chat {
namespace {

std::string type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

Status field_error(const std::string& path, const std::string& problem) {
  return invalid_argument(path + ": " + problem);
}

Status expect_type(const Json& v, const std::string& path, bool ok, const char* wanted) {
  if (ok) return Status::ok();
  return field_error(path, std::string("expected ") + wanted + ", got " + type_name(v));
}

// Optional string field: absent or null -> nullopt.
Result<std::optional<std::string>> opt_string(const Json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  MR_RETURN_IF_ERROR(expect_type(*it, path + "." + key, it->is_string(), "a string"));
  return std::optional<std::string>(it->get<std::string>());
}

Result<ContentPart> parse_part(const Json& part, const std::string& path) {
  MR_RETURN_IF_ERROR(expect_type(part, path, part.is_object(), "an object"));
  auto type_it = part.find("type");
  if (type_it == part.end() || !type_it->is_string())
    return field_error(path + ".type", "expected a string (\"text\" or \"image_url\")");
  const std::string type = type_it->get<std::string>();
  ContentPart out;
  if (type == "text") {
    auto it = part.find("text");
    if (it == part.end() || !it->is_string()) return field_error(path + ".text", "expected a string");
    out.kind = ContentPart::Kind::kText;
    out.text = it->get<std::string>();
    return out;
  }
  if (type == "image_url" || type == "image") {
    out.kind = ContentPart::Kind::kImage;
    auto it = part.find(type);
    if (it != part.end()) {
      if (it->is_string()) {
        out.image_url = it->get<std::string>();
      } else if (it->is_object() && it->contains("url") && (*it)["url"].is_string()) {
        out.image_url = (*it)["url"].get<std::string>();
      } else {
        return field_error(path + "." + type, "expected {\"url\": string} or a string");
      }
    }
    return out;
  }
  return field_error(path + ".type", "unknown content part type '" + type + "' (text, image_url)");
}

Result<Content> parse_content(const Json& msg, const std::string& path) {
  Content out;
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return out;
  if (it->is_string()) {
    out.kind = Content::Kind::kText;
    out.text = it->get<std::string>();
    return out;
  }
  if (!it->is_array())
    return field_error(path + ".content", "expected a string, an array of content parts, or null, got " + type_name(*it));
  out.kind = Content::Kind::kParts;
  for (size_t i = 0; i < it->size(); ++i)
    out.parts.push_back(MR_TRY(parse_part((*it)[i], path + ".content[" + std::to_string(i) + "]")));
  return out;
}

Result<ToolCall> parse_tool_call(const Json& tc, const std::string& path) {
  MR_RETURN_IF_ERROR(expect_type(tc, path, tc.is_object(), "an object"));
  ToolCall out;
  auto id_it = tc.find("id");
  if (id_it != tc.end() && !id_it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*id_it, path + ".id", id_it->is_string(), "a string"));
    out.id = id_it->get<std::string>();
  }
  // OpenAI nests name/arguments under "function"; a flat {name, arguments} is accepted too.
  const Json* fn = &tc;
  std::string fn_path = path;
  auto fn_it = tc.find("function");
  if (fn_it != tc.end()) {
    MR_RETURN_IF_ERROR(expect_type(*fn_it, path + ".function", fn_it->is_object(), "an object"));
    fn = &*fn_it;
    fn_path = path + ".function";
  }
  auto name_it = fn->find("name");
  if (name_it == fn->end() || !name_it->is_string())
    return field_error(fn_path + ".name", "expected a string");
  out.name = name_it->get<std::string>();
  auto args_it = fn->find("arguments");
  if (args_it != fn->end()) {
    if (!args_it->is_string() && !args_it->is_object() && !args_it->is_null())
      return field_error(fn_path + ".arguments", "expected a string holding a JSON object, got " + type_name(*args_it));
    out.arguments = *args_it;
  }
  return out;
}

Result<Role> parse_role(const Json& msg, const std::string& path) {
  auto it = msg.find("role");
  if (it == msg.end()) return field_error(path + ".role", "missing");
  MR_RETURN_IF_ERROR(expect_type(*it, path + ".role", it->is_string(), "a string"));
  const std::string role = it->get<std::string>();
  if (role == "system") return Role::kSystem;
  if (role == "developer") return Role::kDeveloper;
  if (role == "user") return Role::kUser;
  if (role == "assistant") return Role::kAssistant;
  if (role == "tool") return Role::kTool;
  return field_error(path + ".role", "unknown role '" + role + "' (system, developer, user, assistant, tool)");
}

Result<Message> parse_message(const Json& msg, const std::string& path) {
  MR_RETURN_IF_ERROR(expect_type(msg, path, msg.is_object(), "an object"));
  Message out;
  out.role = MR_TRY(parse_role(msg, path));
  out.name = MR_TRY(opt_string(msg, "name", path));
  out.content = MR_TRY(parse_content(msg, path));
  if (out.role == Role::kAssistant) {
    // The first non-empty of reasoning_content / reasoning (the reference's `a or b`).
    for (const char* key : {"reasoning_content", "reasoning"}) {
      auto r = MR_TRY(opt_string(msg, key, path));
      if (r && !r->empty()) { out.reasoning = std::move(r); break; }
    }
    auto tcs = msg.find("tool_calls");
    if (tcs != msg.end() && !tcs->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*tcs, path + ".tool_calls", tcs->is_array(), "an array"));
      for (size_t i = 0; i < tcs->size(); ++i)
        out.tool_calls.push_back(MR_TRY(parse_tool_call((*tcs)[i], path + ".tool_calls[" + std::to_string(i) + "]")));
    }
  }
  if (out.role == Role::kTool) {
    out.tool_call_id = MR_TRY(opt_string(msg, "tool_call_id", path));
    // Its `name` only: a `tool` (or `index`) key is not an OpenAI field, and vLLM's message
    // parsing leaves it out before the K3 encoder could read it.
    out.tool_name = out.name;
  }
  if (out.role == Role::kSystem || out.role == Role::kDeveloper) {
    auto tools = msg.find("tools");
    if (tools != msg.end() && !tools->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*tools, path + ".tools", tools->is_array(), "an array"));
      out.tools = *tools;
    }
  }
  return out;
}

Status check_tools(const Json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = "tools[" + std::to_string(i) + "]";
    const Json& t = tools[i];
    MR_RETURN_IF_ERROR(expect_type(t, path, t.is_object(), "an object"));
    auto type = t.find("type");
    if (type != t.end() && !(type->is_string() && type->get<std::string>() == "function"))
      return field_error(path + ".type", "only \"function\" tools are supported");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return field_error(path + ".function", "expected an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      return field_error(path + ".function.name", "expected a non-empty string");
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_object() && !params->is_null())
      return field_error(path + ".function.parameters", "expected a JSON Schema object");
  }
  return Status::ok();
}

Result<ToolChoice> parse_tool_choice(const Json& v) {
  ToolChoice out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto") out.kind = ToolChoice::Kind::kAuto;
    else if (s == "none") out.kind = ToolChoice::Kind::kNone;
    else if (s == "required") out.kind = ToolChoice::Kind::kRequired;
    else return field_error("tool_choice", "unknown value '" + s + "' (auto, none, required, or a named function)");
    return out;
  }
  if (v.is_object()) {
    auto fn = v.find("function");
    if (fn == v.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return field_error("tool_choice.function.name", "expected a string");
    out.kind = ToolChoice::Kind::kNamed;
    out.function_name = (*fn)["name"].get<std::string>();
    return out;
  }
  return field_error("tool_choice", "expected a string or an object, got " + type_name(v));
}

Result<ResponseFormat> parse_response_format(const Json& v) {
  ResponseFormat out;
  if (v.is_null()) return out;
  MR_RETURN_IF_ERROR(expect_type(v, "response_format", v.is_object(), "an object"));
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) return field_error("response_format.type", "expected a string");
  const std::string t = type->get<std::string>();
  if (t == "text") return out;
  if (t == "json_object") { out.kind = ResponseFormat::Kind::kJsonObject; return out; }
  if (t == "json_schema") {
    out.kind = ResponseFormat::Kind::kJsonSchema;
    auto js = v.find("json_schema");
    if (js != v.end() && !js->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*js, "response_format.json_schema", js->is_object(), "an object"));
      out.json_schema = *js;
    }
    return out;
  }
  return field_error("response_format.type", "unknown type '" + t + "' (text, json_object, json_schema)");
}

template <typename T>
Status get_number(const Json& body, const char* key, std::optional<T>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status::ok();
  if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return field_error(key, "expected a number, got " + type_name(*it));
    out = it->get<double>();
  } else {
    if (!it->is_number_integer()) return field_error(key, "expected an integer, got " + type_name(*it));
    if (std::is_unsigned_v<T> && !it->is_number_unsigned()) return field_error(key, "expected a non-negative integer");
    out = it->get<T>();
  }
  return Status::ok();
}

// The reference order (vLLM's _apply_k3_thinking_kwargs over the chat template kwargs,
// which carry the request's reasoning_effort unless they name one themselves):
// thinking, else enable_thinking; reasoning_effort "none" turns thinking off only when
// neither is set, any other reasoning_effort is the effort unless thinking_effort is.
Status parse_thinking(const Json& body, ChatRequest& req) {
  std::optional<bool> thinking;
  std::optional<std::string> effort;
  std::optional<std::string> reasoning_effort;
  std::string reasoning_effort_field = "reasoning_effort";
  // vLLM's request field; chat_template_kwargs.add_generation_prompt, read below, wins.
  if (auto it = body.find("add_generation_prompt"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*it, "add_generation_prompt", it->is_boolean(), "a boolean"));
    req.add_generation_prompt = it->get<bool>();
  }
  auto kw = body.find("chat_template_kwargs");
  if (kw != body.end() && !kw->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*kw, "chat_template_kwargs", kw->is_object(), "an object"));
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto it = kw->find(key);
      if (it == kw->end() || it->is_null()) continue;
      MR_RETURN_IF_ERROR(expect_type(*it, std::string("chat_template_kwargs.") + key, it->is_boolean(), "a boolean"));
      if (!thinking) thinking = it->get<bool>();
    }
    if (auto it = kw->find("thinking_effort"); it != kw->end() && !it->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*it, "chat_template_kwargs.thinking_effort", it->is_string(), "a string"));
      effort = it->get<std::string>();
      req.thinking_effort_field = "chat_template_kwargs.thinking_effort";
    }
    if (auto it = kw->find("reasoning_effort"); it != kw->end() && !it->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*it, "chat_template_kwargs.reasoning_effort", it->is_string(), "a string"));
      reasoning_effort = it->get<std::string>();
      reasoning_effort_field = "chat_template_kwargs.reasoning_effort";
    }
    if (auto it = kw->find("add_generation_prompt"); it != kw->end() && !it->is_null()) {
      MR_RETURN_IF_ERROR(
          expect_type(*it, "chat_template_kwargs.add_generation_prompt", it->is_boolean(), "a boolean"));
      req.add_generation_prompt = it->get<bool>();
    }
  }
  auto re = body.find("reasoning_effort");
  if (re != body.end() && !re->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*re, "reasoning_effort", re->is_string(), "a string"));
    if (!reasoning_effort) reasoning_effort = re->get<std::string>();
  }
  if (reasoning_effort) {
    if (*reasoning_effort == "none") {
      if (!thinking) thinking = false;
    } else if (!effort) {
      effort = *reasoning_effort;
      req.thinking_effort_field = reasoning_effort_field;
    }
  }
  if (effort) req.thinking_effort = *effort;
  req.thinking = thinking.value_or(true);
  return Status::ok();
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kDeveloper: return "developer";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
  }
  return "?";
}

int Content::num_images() const {
  int n = 0;
  for (const auto& p : parts) n += p.kind == ContentPart::Kind::kImage;
  return n;
}

Result<ChatRequest> parse_chat_request(const Json& body) {
  if (!body.is_object()) return invalid_argument("request: expected a JSON object, got " + type_name(body));
  ChatRequest req;
  auto model = MR_TRY(opt_string(body, "model", "request"));
  if (model) req.model = *model;

  auto msgs = body.find("messages");
  if (msgs == body.end()) return field_error("messages", "missing");
  MR_RETURN_IF_ERROR(expect_type(*msgs, "messages", msgs->is_array(), "an array"));
  if (msgs->empty()) return field_error("messages", "must contain at least one message");
  for (size_t i = 0; i < msgs->size(); ++i)
    req.messages.push_back(MR_TRY(parse_message((*msgs)[i], "messages[" + std::to_string(i) + "]")));

  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*tools, "tools", tools->is_array(), "an array"));
    MR_RETURN_IF_ERROR(check_tools(*tools));
    req.tools = *tools;
  }
  if (auto it = body.find("tool_choice"); it != body.end()) req.tool_choice = MR_TRY(parse_tool_choice(*it));
  if (req.tool_choice.kind == ToolChoice::Kind::kNamed) {
    bool found = false;
    for (const auto& t : req.tools.is_array() ? req.tools : Json::array())
      found |= t["function"]["name"] == req.tool_choice.function_name;
    if (!found)
      return field_error("tool_choice.function.name", "'" + req.tool_choice.function_name + "' is not one of the request's tools");
  }
  if (req.tool_choice.kind == ToolChoice::Kind::kRequired && !(req.tools.is_array() && !req.tools.empty()))
    return field_error("tool_choice", "'required' needs at least one tool in `tools`");
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*it, "parallel_tool_calls", it->is_boolean(), "a boolean"));
    req.parallel_tool_calls = it->get<bool>();
  }
  if (auto it = body.find("response_format"); it != body.end()) req.response_format = MR_TRY(parse_response_format(*it));
  MR_RETURN_IF_ERROR(parse_thinking(body, req));

  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*it, "stream", it->is_boolean(), "a boolean"));
    req.stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*it, "stream_options", it->is_object(), "an object"));
    if (auto u = it->find("include_usage"); u != it->end() && !u->is_null()) {
      MR_RETURN_IF_ERROR(expect_type(*u, "stream_options.include_usage", u->is_boolean(), "a boolean"));
      req.include_usage = u->get<bool>();
    }
  }
  std::optional<int64_t> max_tokens, max_completion_tokens;
  MR_RETURN_IF_ERROR(get_number(body, "max_tokens", max_tokens));
  MR_RETURN_IF_ERROR(get_number(body, "max_completion_tokens", max_completion_tokens));
  req.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (req.max_tokens && *req.max_tokens < 1)
    return field_error(max_completion_tokens ? "max_completion_tokens" : "max_tokens", "must be at least 1");
  MR_RETURN_IF_ERROR(get_number(body, "temperature", req.temperature));
  if (req.temperature && (*req.temperature < 0 || *req.temperature > 2 || std::isnan(*req.temperature)))
    return field_error("temperature", "must be between 0 and 2");
  MR_RETURN_IF_ERROR(get_number(body, "top_p", req.top_p));
  if (req.top_p && !(*req.top_p > 0 && *req.top_p <= 1)) return field_error("top_p", "must be in (0, 1]");
  MR_RETURN_IF_ERROR(get_number(body, "top_k", req.top_k));
  std::optional<int64_t> n;
  MR_RETURN_IF_ERROR(get_number(body, "n", n));
  if (n) {
    if (*n < 1) return field_error("n", "must be at least 1");
    req.n = *n;
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      req.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        MR_RETURN_IF_ERROR(expect_type((*it)[i], "stop[" + std::to_string(i) + "]", (*it)[i].is_string(), "a string"));
        req.stop.push_back((*it)[i].get<std::string>());
      }
    } else {
      return field_error("stop", "expected a string or an array of strings, got " + type_name(*it));
    }
  }
  MR_RETURN_IF_ERROR(get_number(body, "seed", req.seed));
  std::optional<double> presence, frequency;
  MR_RETURN_IF_ERROR(get_number(body, "presence_penalty", presence));
  MR_RETURN_IF_ERROR(get_number(body, "frequency_penalty", frequency));
  req.presence_penalty = presence.value_or(0.0);
  req.frequency_penalty = frequency.value_or(0.0);
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    MR_RETURN_IF_ERROR(expect_type(*it, "logprobs", it->is_boolean(), "a boolean"));
    req.logprobs = it->get<bool>();
  }
  MR_RETURN_IF_ERROR(get_number(body, "top_logprobs", req.top_logprobs));
  if (req.top_logprobs && (*req.top_logprobs < 0 || *req.top_logprobs > 20))
    return field_error("top_logprobs", "must be between 0 and 20");
  return req;
}

Result<ChatRequest> parse_chat_request_text(std::string_view body) {
  Json json;
  try {
    json = Json::parse(body.begin(), body.end());
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("request: invalid JSON: ") + e.what());
  }
  return parse_chat_request(json);
}

}  // namespace moonrun::chat
