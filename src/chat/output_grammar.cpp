// Completion grammars for K3 and K2; see output_grammar.h.
#include "chat/output_grammar.h"

#include <algorithm>
#include <functional>

#include "grammar/json_schema.h"

namespace moonrun::chat {
namespace {

using grammar::Builder;
using Frag = Builder::Frag;

struct Need {
  bool json = false;          // the response is a JSON value
  bool calls = false;         // the tool channel may hold calls
  bool calls_required = false;
  bool single_call = false;
  const Json* named = nullptr;  // tool_choice names this tool
};

Need what_to_constrain(const ChatRequest& r) {
  Need n;
  n.json = r.response_format.kind != ResponseFormat::Kind::kText;
  const bool declared = r.tools.is_array() && !r.tools.empty();
  const auto choice = r.tool_choice.kind;
  n.calls = declared && choice != ToolChoice::Kind::kNone;
  n.calls_required = n.calls && (choice == ToolChoice::Kind::kRequired || choice == ToolChoice::Kind::kNamed);
  n.single_call = !r.parallel_tool_calls || choice == ToolChoice::Kind::kNamed;
  if (choice == ToolChoice::Kind::kNamed)
    for (const Json& t : r.tools)
      if (t["function"]["name"] == r.tool_choice.function_name) n.named = &t;
  return n;
}

bool needs_grammar(const Need& n) { return n.json || n.calls_required || (n.calls && n.single_call); }

// The schema of a json_schema response format (as the K3 encoder reads it).
Json response_schema(const ResponseFormat& rf, std::string& path) {
  const Json& js = rf.json_schema;
  path = "response_format.json_schema";
  if (!js.is_object()) return true;
  if (js.contains("schema")) {
    path += ".schema";
    return js["schema"];
  }
  if (js.contains("json_schema")) {
    path += ".json_schema";
    return js["json_schema"];
  }
  return js;
}

std::string escape_attr(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out.push_back(c);
  }
  return out;
}

class FormatGrammar {
 public:
  FormatGrammar(ChatFormat format, const ChatRequest& request, const Tokenizer& tokenizer)
      : format_(format), request_(request), tok_(tokenizer), json_(b_) {}

  Result<std::shared_ptr<const grammar::Grammar>> build() {
    const Need need = what_to_constrain(request_);
    const int32_t root = b_.declare_rule("completion");
    Status st;
    b_.define(root, [&] {
      auto f = format_ == ChatFormat::kKimiK3 ? k3(need) : k2(need);
      if (!f.is_ok()) {
        st = f.status();
        return b_.empty();
      }
      return *f;
    });
    if (!st.is_ok()) return st;
    auto g = std::make_shared<grammar::Grammar>(b_.finish(root));
    if (g->rules[root].min_length >= INT32_MAX / 8)
      return invalid_argument("the requested output cannot be completed (a schema with infinite recursion)");
    return std::shared_ptr<const grammar::Grammar>(std::move(g));
  }

 private:
  // A marker: its special token where the tokenizer has one, else its spelling.
  Frag marker(const std::string& name) {
    if (auto id = tok_.special_id(name)) return b_.special(static_cast<int32_t>(*id));
    return b_.literal(name);
  }
  Frag text() {  // any ordinary text: every byte, never a special token
    grammar::SymbolSet all;
    for (int c = 0; c < 256; ++c) all.set(c);
    return b_.star(b_.symbols(all));
  }
  Frag k3_open(const std::string& tag) { return b_.seq({marker("<|open|>"), b_.literal(tag), marker("<|sep|>")}); }
  Frag k3_close(const std::string& tag) { return b_.seq({marker("<|close|>"), b_.literal(tag), marker("<|sep|>")}); }

  Result<Frag> response_json() {
    if (request_.response_format.kind == ResponseFormat::Kind::kJsonObject) return b_.call(json_.any_object());
    std::string path;
    schema_ = response_schema(request_.response_format, path);
    return b_.call(MR_TRY(json_.value(schema_, schema_, path)));
  }

  std::vector<const Json*> callable_tools(const Need& need) {
    std::vector<const Json*> out;
    if (need.named) return {need.named};
    for (const Json& t : request_.tools) out.push_back(&t);
    return out;
  }

  std::string tool_path(const Json* tool) const {
    for (size_t i = 0; i < request_.tools.size(); ++i)
      if (&request_.tools[i] == tool) return "tools[" + std::to_string(i) + "].function.parameters";
    return "tools[?].function.parameters";
  }

  // One K3 argument of a tool: the type attribute and the value written as that type.
  Result<Frag> k3_argument_value(const Json& schema, const Json& root, const std::string& path, int depth) {
    if (depth > 16) return invalid_argument(path + ": nested anyOf/$ref too deep");
    if (schema.is_object()) {
      for (const char* key : {"anyOf", "oneOf"}) {
        if (!schema.contains(key)) continue;
        std::vector<Frag> options;
        const Json& subs = schema[key];
        if (!subs.is_array() || subs.empty()) return invalid_argument(path + "." + key + ": expected a non-empty array");
        for (size_t i = 0; i < subs.size(); ++i)
          options.push_back(MR_TRY(k3_argument_value(subs[i], root, path + "." + key + "[" + std::to_string(i) + "]", depth + 1)));
        return b_.alt(std::move(options));
      }
      if (schema.contains("$ref") && schema["$ref"].is_string()) {
        const std::string ref = schema["$ref"].get<std::string>();
        if (ref.empty() || ref[0] != '#') return invalid_argument(path + ".$ref: only \"#...\" references are supported");
        try {
          const Json& target = root.at(Json::json_pointer(ref.substr(1)));
          return k3_argument_value(target, root, path, depth + 1);
        } catch (const nlohmann::json::exception&) {
          return invalid_argument(path + ".$ref: '" + ref + "' does not resolve in the schema");
        }
      }
    }
    std::vector<std::string> types = MR_TRY(json_.types_of(schema, root, path));
    if (types.empty()) types = {"string", "number", "boolean", "null", "object", "array"};
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<Frag> options;
    std::vector<std::string> done;
    for (const std::string& t : types) {
      if (std::find(done.begin(), done.end(), t) != done.end()) continue;
      done.push_back(t);
      if (t == "integer" && has_number) continue;  // "number" covers it
      const std::string attr = t == "integer" ? "number" : t;  // the XTML type names
      Frag value;
      if (t == "string") {
        value = b_.call(MR_TRY(json_.raw_string(schema, root, path)));
      } else {
        // The schema narrowed to this type (its enum values of this type only).
        Json narrowed = schema.is_object() ? schema : Json::object();
        if (narrowed.contains("enum")) {
          Json kept = Json::array();
          for (const Json& v : narrowed["enum"]) {
            const bool keep = (attr == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
                              (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
                              (t == "array" && v.is_array());
            if (keep) kept.push_back(v);
          }
          if (kept.empty()) continue;
          narrowed["enum"] = kept;
        } else if (!narrowed.contains("const")) {
          narrowed["type"] = t;
        }
        value = b_.call(MR_TRY(json_.value(narrowed, root, path)));
      }
      options.push_back(b_.seq({b_.literal("type=\"" + attr + "\""), marker("<|sep|>"), value}));
    }
    if (options.empty()) return invalid_argument(path + ": no value type to generate");
    return b_.alt(std::move(options));
  }

  Result<Frag> k3_call(const Json* tool) {
    const Json& fn = (*tool)["function"];
    const std::string name = fn["name"].get<std::string>();
    const std::string path = tool_path(tool);
    static const Json kNoParams = Json::object();
    const Json& params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : kNoParams;
    std::vector<Frag> parts;
    parts.push_back(marker("<|open|>"));
    parts.push_back(b_.literal("call tool=\"" + escape_attr(name) + "\" index=\""));
    parts.push_back(b_.byte_range('1', '9'));
    parts.push_back(b_.literal("\""));
    parts.push_back(marker("<|sep|>"));
    std::vector<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const Json& r : params["required"])
        if (r.is_string()) required.push_back(r.get<std::string>());
    if (params.contains("properties") && params["properties"].is_object()) {
      for (const auto& [key, schema] : params["properties"].items()) {
        const std::string arg_path = path + ".properties." + key;
        Frag arg = b_.seq({marker("<|open|>"), b_.literal("argument key=\"" + escape_attr(key) + "\" "),
                           MR_TRY(k3_argument_value(schema, params, arg_path, 0)), k3_close("argument")});
        const bool req = std::find(required.begin(), required.end(), key) != required.end();
        parts.push_back(req ? arg : b_.opt(arg));
      }
    }
    parts.push_back(k3_close("call"));
    return b_.seq(std::move(parts));
  }

  Result<Frag> calls(const Need& need, const std::function<Result<Frag>(const Json*)>& one) {
    std::vector<Frag> options;
    const auto tools = callable_tools(need);
    // One rule per call shape, used by every call position.
    const int32_t call_rule = b_.declare_rule("call");
    Status st;
    b_.define(call_rule, [&] {
      std::vector<Frag> alts;
      for (const Json* t : tools) {
        auto f = one(t);
        if (!f.is_ok()) {
          st = f.status();
          return b_.empty();
        }
        alts.push_back(*f);
      }
      return b_.alt(std::move(alts));
    });
    if (!st.is_ok()) return st;
    if (need.single_call) return b_.call(call_rule);
    return b_.plus([&] { return b_.call(call_rule); });
  }

  Result<Frag> k3(const Need& need) {
    std::vector<Frag> parts;
    if (request_.thinking) parts.push_back(b_.seq({text(), k3_close("think"), k3_open("response")}));
    parts.push_back(need.json ? MR_TRY(response_json()) : text());
    parts.push_back(k3_close("response"));
    if (need.calls) {
      const Frag tools = b_.seq({k3_open("tools"), MR_TRY(calls(need, [&](const Json* t) { return k3_call(t); })),
                                 k3_close("tools")});
      parts.push_back(need.calls_required ? tools : b_.opt(tools));
    }
    parts.push_back(k3_close("message"));
    parts.push_back(marker("<|end_of_msg|>"));
    return b_.seq(std::move(parts));
  }

  Result<Frag> k2(const Need& need) {
    std::vector<Frag> parts;
    // K2-Thinking opens its reasoning with <think> itself (the prompt does not).
    if (request_.thinking) parts.push_back(b_.seq({b_.opt(marker("<think>")), text(), marker("</think>")}));
    parts.push_back(need.json ? MR_TRY(response_json()) : text());
    if (need.calls) {
      auto one = [&](const Json* tool) -> Result<Frag> {
        const Json& fn = (*tool)["function"];
        static const Json kObject = Json{{"type", "object"}};
        const Json& params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : kObject;
        grammar::SymbolSet digit;
        for (char c = '0'; c <= '9'; ++c) digit.set(static_cast<unsigned char>(c));
        return b_.seq({marker("<|tool_call_begin|>"), b_.literal("functions." + fn["name"].get<std::string>() + ":"),
                       b_.repeat([&] { return b_.symbols(digit); }, 1, 3), marker("<|tool_call_argument_begin|>"),
                       b_.call(MR_TRY(json_.value(params, params, tool_path(tool)))), marker("<|tool_call_end|>")});
      };
      const Frag section = b_.seq({marker("<|tool_calls_section_begin|>"), MR_TRY(calls(need, one)),
                                   marker("<|tool_calls_section_end|>")});
      parts.push_back(need.calls_required ? section : b_.opt(section));
    }
    if (tok_.special_id("<|im_end|>")) parts.push_back(marker("<|im_end|>"));
    return b_.seq(std::move(parts));
  }

  ChatFormat format_;
  const ChatRequest& request_;
  const Tokenizer& tok_;
  Builder b_;
  grammar::JsonGrammar json_;
  Json schema_;  // the response schema ($refs resolve in it for the grammar's lifetime)
};

}  // namespace

Result<std::shared_ptr<const grammar::Grammar>> output_grammar(ChatFormat format, const ChatRequest& request,
                                                               const Tokenizer& tokenizer) {
  const Need need = what_to_constrain(request);
  if (!needs_grammar(need) || !request.add_generation_prompt) return std::shared_ptr<const grammar::Grammar>();
  return FormatGrammar(format, request, tokenizer).build();
}

std::shared_ptr<const grammar::TokenVocab> token_vocab(const Tokenizer& tok, std::vector<int32_t> eos) {
  std::vector<std::string> bytes(tok.vocab_size());
  std::vector<bool> special(tok.vocab_size(), false);
  for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
    special[id] = tok.is_special(id);
    if (!special[id]) bytes[id] = std::string(tok.token_bytes(id));
  }
  return std::make_shared<grammar::TokenVocab>(std::move(bytes), std::move(special), std::move(eos));
}

std::string output_grammar_key(ChatFormat format, const ChatRequest& request) {
  Json key = Json::object();
  key["format"] = chat_format_name(format);
  key["thinking"] = request.thinking;
  key["response_format"] = static_cast<int>(request.response_format.kind);
  key["schema"] = request.response_format.json_schema;
  key["tools"] = request.tools;
  key["tool_choice"] = static_cast<int>(request.tool_choice.kind);
  key["tool_name"] = request.tool_choice.function_name;
  key["parallel"] = request.parallel_tool_calls;
  key["agp"] = request.add_generation_prompt;
  return key.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace moonrun::chat
