// Kimi K3 XTML rendering. The structure, in the reference's order:
//   [tool-declare system message]  when the request has tools
//   [thinking-effort system message]  when thinking
//   the conversation, one <|open|>message ...<|close|>message<|sep|><|end_of_msg|> each
//   [tool-choice system message]  for tool_choice required / none, when the request has tools
//   [response-format system message]  for json_object / json_schema
//   <|open|>message role="assistant"<|sep|><|open|>think<|sep|>   (or response)
// Segments are emitted exactly where the reference emits them (one per tag name, attribute
// key, `="`, value and closing quote), empty texts dropped, because the tokenizer encodes
// each segment separately.
#include "chat/render_k3.h"

#include <algorithm>
#include <map>

#include "chat/py_json.h"

namespace moonrun::chat {
namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

std::string escape_attr_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out.push_back(c);
  }
  return out;
}

class K3Writer {
 public:
  explicit K3Writer(const std::vector<std::string>& image_prompts) : image_prompts_(image_prompts) {}

  void text(std::string_view s) {
    if (!s.empty()) out_.push_back({std::string(s), false});
  }
  void special(std::string_view s) {
    if (!s.empty()) out_.push_back({std::string(s), true});
  }
  void open_tag(std::string_view tag, const Attrs& attrs = {}) {
    special(kK3Open);
    text(tag);
    for (const auto& [key, value] : attrs) {
      text(" " + key);
      text("=\"");
      text(escape_attr_value(value));
      text("\"");
    }
    special(kK3Sep);
  }
  void close_tag(std::string_view tag) {
    special(kK3Close);
    text(tag);
    special(kK3Sep);
  }
  void end_of_msg() { special(kK3EndOfMsg); }

  // Message text. With image prompts, a literal placeholder inside text is an image too
  // (the reference splits on it); without, text is only text.
  Status body_text(std::string_view s) {
    if (s.empty()) return Status::ok();
    if (image_prompts_.empty() || s.find(kK3ImagePlaceholder) == std::string_view::npos) {
      text(s);
      return Status::ok();
    }
    const std::string_view ph = kK3ImagePlaceholder;
    size_t start = 0;
    while (true) {
      const size_t at = s.find(ph, start);
      text(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
      if (at == std::string_view::npos) break;
      MR_RETURN_IF_ERROR(image());
      start = at + ph.size();
    }
    return Status::ok();
  }

  Status image() {
    if (image_prompts_.empty()) {
      special(kK3ImagePlaceholder);
      return Status::ok();
    }
    if (images_used_ >= image_prompts_.size())
      return invalid_argument("images: more images in the messages than image prompts (" +
                              std::to_string(image_prompts_.size()) + ")");
    special(image_prompts_[images_used_++]);
    return Status::ok();
  }

  Status content(const Content& c) {
    if (c.kind == Content::Kind::kText) return body_text(c.text);
    for (const auto& part : c.parts) {
      if (part.kind == ContentPart::Kind::kImage) {
        MR_RETURN_IF_ERROR(image());
      } else {
        MR_RETURN_IF_ERROR(body_text(part.text));
      }
    }
    return Status::ok();
  }

  // A system message the encoder adds on its own (effort, tool choice, response format).
  void internal_system_message(const char* type, std::string_view body) {
    open_tag("message", {{"role", "system"}, {"type", type}});
    text(py_strip(body));
    close_tag("message");
    end_of_msg();
  }

  void tool_declare(const Json& tools, bool dynamic) {
    const std::string json = py_json_dumps(deep_sorted(tools), JsonSeparators::kCompact);
    std::string body;
    if (dynamic) {
      body = "## New Tools Available\n"
             "The system dynamically extends the toolset via lazy-loading.\n"
             "You have access to all existing and extended tools.\n"
             "Here are the specs for the extended tools.\n\n```json\n" + json + "\n```";
    } else {
      body = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" + json + "\n```";
    }
    open_tag("message", {{"role", "system"}, {"type", "tool-declare"}});
    text(body);
    close_tag("message");
    end_of_msg();
  }

  Status check_all_images_used() const {
    if (!image_prompts_.empty() && images_used_ != image_prompts_.size())
      return invalid_argument("images: " + std::to_string(image_prompts_.size()) + " image prompts given but " +
                              std::to_string(images_used_) + " images in the messages");
    return Status::ok();
  }

  std::vector<Segment> take() { return std::move(out_); }

 private:
  const std::vector<std::string>& image_prompts_;
  size_t images_used_ = 0;
  std::vector<Segment> out_;
};

struct Indexed {
  size_t index;  // in the request, for error messages
  Message msg;
};

// Tool results in assistant tool_calls order: each run of consecutive tool messages is
// matched by tool_call_id against the latest assistant's calls and stably sorted by call
// position; a matched message takes that call's function name. A run with any unmatched
// message stays as it is. (The reference's normalize_xtml_tool_result_messages.) The run
// right after the assistant may also name a call by the alias "NAME:POSITION" (0-based),
// as vLLM's K3 renderer resolves it before the encoder (_normalize_k3_tool_messages).
std::vector<Indexed> order_tool_results(const std::vector<Message>& messages) {
  std::vector<Indexed> out;
  using Target = std::pair<size_t, std::string>;  // (1-based position, name)
  std::map<std::string, Target> by_id, by_alias;
  size_t i = 0;
  while (i < messages.size()) {
    const Message& m = messages[i];
    if (m.role != Role::kTool) {
      if (m.role == Role::kAssistant) {
        by_id.clear();
        by_alias.clear();
        for (size_t p = 0; p < m.tool_calls.size(); ++p) {
          const ToolCall& c = m.tool_calls[p];
          if (c.id) by_id.emplace(*c.id, Target{p + 1, c.name});
          if (c.name.empty()) continue;  // vLLM keys only named calls, first key first
          if (c.id) by_alias.emplace(*c.id, Target{p + 1, c.name});
          by_alias.emplace(c.name + ":" + std::to_string(p), Target{p + 1, c.name});
        }
      }
      out.push_back({i, m});
      ++i;
      continue;
    }
    const bool after_assistant = i > 0 && messages[i - 1].role == Role::kAssistant;
    const std::map<std::string, Target>& targets = after_assistant ? by_alias : by_id;
    struct RunItem { size_t position; size_t offset; Indexed item; };
    std::vector<RunItem> run;
    bool unresolved = false;
    for (size_t offset = 0; i < messages.size() && messages[i].role == Role::kTool; ++i, ++offset) {
      Indexed item{i, messages[i]};
      auto it = item.msg.tool_call_id ? targets.find(*item.msg.tool_call_id) : targets.end();
      if (it == targets.end()) {
        unresolved = true;
        run.push_back({0, offset, std::move(item)});
      } else {
        item.msg.tool_name = it->second.second;
        run.push_back({it->second.first, offset, std::move(item)});
      }
    }
    if (unresolved) {
      for (auto& r : run) out.push_back({r.item.index, messages[r.item.index]});  // untouched
    } else {
      std::stable_sort(run.begin(), run.end(), [](const RunItem& a, const RunItem& b) { return a.position < b.position; });
      for (auto& r : run) out.push_back(std::move(r.item));
    }
  }
  return out;
}

// Tool-call arguments as the reference normalises them: an object renders one argument tag
// per key; null or a blank string is no arguments; a string that is not JSON is kept
// verbatim in a <json type="object"> block; any other JSON is an error. Strings are read
// as Python's json.loads reads them (exact big integers, NaN), since every value is dumped
// back into the prompt.
struct CallArguments {
  PyJson object{PyJson::Kind::kObject};
  std::optional<std::string> json_block;
};

Result<CallArguments> normalize_arguments(const Json& args, const std::string& path) {
  CallArguments out;
  if (args.is_null()) return out;
  if (args.is_object()) {
    out.object = py_json_from(args);
    return out;
  }
  const std::string& s = args.get_ref<const std::string&>();
  if (py_is_blank(s)) return out;
  std::optional<PyJson> parsed = py_json_loads(s);
  if (!parsed) {
    out.json_block = s;
    return out;
  }
  if (parsed->kind != PyJson::Kind::kObject)
    return invalid_argument(path + ": Kimi K3 tool call arguments must be a JSON object");
  out.object = std::move(*parsed);
  return out;
}

Status render_assistant(K3Writer& w, const Message& m, bool thinking, const std::string& path) {
  if (thinking) {
    // The think channel is structural: present even when empty.
    w.open_tag("think");
    if (m.reasoning && !py_is_blank(*m.reasoning)) MR_RETURN_IF_ERROR(w.body_text(*m.reasoning));
    w.close_tag("think");
  }
  w.open_tag("response");
  MR_RETURN_IF_ERROR(w.content(m.content));
  w.close_tag("response");
  if (m.tool_calls.empty()) return Status::ok();
  w.open_tag("tools");
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall& tc = m.tool_calls[c];
    const std::string call_path = path + ".tool_calls[" + std::to_string(c) + "].function.arguments";
    CallArguments args = MR_TRY(normalize_arguments(tc.arguments, call_path));
    w.open_tag("call", {{"tool", tc.name}, {"index", std::to_string(c + 1)}});
    if (args.json_block) {
      w.open_tag("json", {{"type", "object"}});
      MR_RETURN_IF_ERROR(w.body_text(*args.json_block));
      w.close_tag("json");
    } else {
      for (const auto& [key, value] : args.object.members) {
        w.open_tag("argument", {{"key", key}, {"type", py_json_xtml_type(value)}});
        const bool raw = value.kind == PyJson::Kind::kString;  // strings raw, the rest JSON
        MR_RETURN_IF_ERROR(w.body_text(raw ? value.text : py_json_dumps(value, JsonSeparators::kPythonDefault)));
        w.close_tag("argument");
      }
    }
    w.close_tag("call");
  }
  w.close_tag("tools");
  return Status::ok();
}

// The schema the json_schema response format asks for: json_schema.schema, else
// json_schema.json_schema (pydantic's field name), else the json_schema object itself.
Json response_schema(const ResponseFormat& rf) {
  const Json& js = rf.json_schema;
  if (!js.is_object()) return nullptr;
  if (js.contains("schema")) return js["schema"];
  if (js.contains("json_schema")) return js["json_schema"];
  return js;
}

// Content that counts as given: a non-empty string, or a non-empty list of parts.
bool has_content(const Content& c) {
  return c.kind == Content::Kind::kText ? !c.text.empty() : c.kind == Content::Kind::kParts && !c.parts.empty();
}

// The request's tools without the null members of each tool and its function, as vLLM's
// renderer passes them (_drop_null_tool_fields: a client's "description": null, or a
// serializer's unset fields, are not in the prompt Moonshot's API renders). Nulls inside
// `parameters` are schema content and stay.
Json without_null_tool_fields(const Json& tools) {
  Json out = Json::array();
  for (const Json& tool : tools) {
    if (!tool.is_object()) {
      out.push_back(tool);
      continue;
    }
    Json t = Json::object();
    for (const auto& [k, v] : tool.items()) {
      if (v.is_null()) continue;
      if (k != "function" || !v.is_object()) {
        t[k] = v;
        continue;
      }
      Json fn = Json::object();
      for (const auto& [fk, fv] : v.items())
        if (!fv.is_null()) fn[fk] = fv;
      t[k] = std::move(fn);
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Result<std::vector<Segment>> render_k3(const ChatRequest& request, const RenderOptions& options) {
  K3Writer w(options.image_prompts);
  const bool thinking = request.thinking;

  if (request.tools.is_array() && !request.tools.empty())
    w.tool_declare(without_null_tool_fields(request.tools), /*dynamic=*/false);

  // With thinking on, the encoder asserts on any other effort (the message text itself
  // lists `medium`, but the encoder does not accept it); with thinking off it is unused.
  const std::string& effort = request.thinking_effort;
  if (thinking && effort != "low" && effort != "high" && effort != "max")
    return invalid_argument(request.thinking_effort_field + ": Kimi K3 supports thinking_effort values low, high, max; got '" +
                            effort + "'");
  if (thinking) {
    w.internal_system_message(
        "thinking-effort",
        "`thinking_effort` guides on how much to think in your thinking channel (not including the "
        "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
        "Now the system is invoked with `thinking_effort=" + effort + "`.");
  }

  const std::vector<ToolCall>* tool_calls = nullptr;  // of the latest assistant message
  size_t tool_index = 0;
  for (const Indexed& item : order_tool_results(request.messages)) {
    const Message& m = item.msg;
    const std::string path = "messages[" + std::to_string(item.index) + "]";
    switch (m.role) {
      case Role::kUser:
      case Role::kSystem:
      case Role::kDeveloper: {
        // A developer message is a system one, as vLLM's K3 renderer hands it to the
        // encoder (which has no branch for the role). A system message with tools is only
        // their declaration; a developer message with content as well is split in two,
        // the declaration and then the content.
        if (m.role != Role::kUser && m.tools.is_array() && !m.tools.empty()) {
          w.tool_declare(m.tools, /*dynamic=*/true);
          if (m.role == Role::kSystem || !has_content(m.content)) break;
        }
        Attrs attrs = {{"role", m.role == Role::kUser ? "user" : "system"}};
        if (m.name && !m.name->empty()) attrs.push_back({"name", *m.name});
        w.open_tag("message", attrs);
        MR_RETURN_IF_ERROR(w.content(m.content));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
      case Role::kTool: {
        ++tool_index;
        std::optional<std::string> tool_name = m.tool_name;
        if (!tool_name && tool_calls && tool_index <= tool_calls->size()) tool_name = (*tool_calls)[tool_index - 1].name;
        if (!tool_name)
          return invalid_argument(path + ": tool message needs a tool name: give `name`, or answer a preceding "
                                  "assistant tool_call (matching tool_call_id, or by order)");
        w.open_tag("message", {{"role", "tool"}, {"tool", *tool_name}, {"index", std::to_string(tool_index)}});
        MR_RETURN_IF_ERROR(w.content(m.content));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
      case Role::kAssistant: {
        tool_calls = &m.tool_calls;
        tool_index = 0;
        Attrs attrs = {{"role", "assistant"}};
        if (m.name && !m.name->empty()) attrs.push_back({"name", *m.name});
        w.open_tag("message", attrs);
        MR_RETURN_IF_ERROR(render_assistant(w, m, thinking, path));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
    }
  }

  // Only for a request with tools, as vLLM's build_chat_params passes it: without them
  // "none" is the API's default, not an instruction.
  const bool has_tools = request.tools.is_array() && !request.tools.empty();
  if (has_tools && request.tool_choice.kind == ToolChoice::Kind::kRequired) {
    w.internal_system_message("tool-choice",
                              "The system is invoked with `tool_choice=required`.\n"
                              "You MUST call tools in the next message.");
  } else if (has_tools && request.tool_choice.kind == ToolChoice::Kind::kNone) {
    w.internal_system_message("tool-choice",
                              "The system is invoked with `tool_choice=none`.\n"
                              "You MUST NOT call any tools in the next message.");
  }

  static constexpr const char* kRawJson =
      "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
  if (request.response_format.kind == ResponseFormat::Kind::kJsonObject) {
    w.internal_system_message("response-format",
                              std::string("The system is invoked with `response_format=json_object`.\n") + kRawJson);
  } else if (request.response_format.kind == ResponseFormat::Kind::kJsonSchema) {
    const std::string schema =
        py_json_dumps(deep_sorted(response_schema(request.response_format)), JsonSeparators::kCompact);
    w.internal_system_message("response-format",
                              std::string("The system is invoked with `response_format=json_schema`.\n") + kRawJson +
                                  "\nThe JSON data must match the following schema:\n```json\n" + schema + "\n```");
  }

  if (options.add_generation_prompt && request.add_generation_prompt) {
    w.open_tag("message", {{"role", "assistant"}});
    w.open_tag(thinking ? "think" : "response");
  }
  MR_RETURN_IF_ERROR(w.check_all_images_used());
  return w.take();
}

}  // namespace moonrun::chat
