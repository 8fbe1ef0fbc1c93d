// JSON Schema -> grammar; see json_schema.h for the subset and why each refusal.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

namespace moonrun::grammar {
namespace {

using Frag = Builder::Frag;

constexpr int kMaxDepth = 64;           // nested schemas without $ref
constexpr int kMaxUnrolled = 1024;      // minItems/maxItems/minLength/maxLength spelled out
constexpr size_t kMaxNodes = 400'000;   // a schema this large is refused, not built
constexpr int kMaxWhitespace = 20;      // a run of layout white space

// Keywords that only describe: they never make a value invalid.
const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                          "name", "contentEncoding", "contentMediaType", "$anchor", "nullable"};
  return s;
}

// Keywords this compiler enforces (per type).
const std::set<std::string>& handled() {
  static const std::set<std::string> s = {
      "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "additionalProperties",
      "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
      "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties", "multipleOf"};
  return s;
}

std::string json_text(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }


}  // namespace

// ---- shared rules ---------------------------------------------------------------------

int32_t JsonGrammar::whitespace() {
  if (ws_ >= 0) return ws_;
  ws_ = b_.declare_rule("ws");
  b_.define(ws_, [&] {
    SymbolSet s;
    for (char c : {' ', '\t', '\n', '\r'}) s.set(static_cast<unsigned char>(c));
    return b_.repeat([&] { return b_.symbols(s); }, 0, kMaxWhitespace);
  });
  return ws_;
}

Frag JsonGrammar::json_char() {
  std::vector<Frag> options;
  SymbolSet plain;
  for (int c = 0x20; c < 0x80; ++c)
    if (c != '"' && c != '\\') plain.set(c);
  options.push_back(b_.symbols(plain));
  SymbolSet esc;
  for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) esc.set(static_cast<unsigned char>(c));
  options.push_back(b_.seq({b_.literal("\\"), b_.symbols(esc)}));
  // \uXXXX, but never half of a surrogate pair (D800-DFFF): a lone one is no character.
  auto hex_set = [](const char* chars) {
    SymbolSet set;
    for (const char* c = chars; *c; ++c) set.set(static_cast<unsigned char>(*c));
    return set;
  };
  const SymbolSet hex = hex_set("0123456789abcdefABCDEF");
  auto hex_digit = [&] { return b_.symbols(hex); };
  options.push_back(b_.seq({b_.literal("\\u"),
                            b_.alt({b_.seq({b_.symbols(hex_set("0123456789abcefABCEF")), hex_digit(), hex_digit(), hex_digit()}),
                                    b_.seq({b_.symbols(hex_set("dD")), b_.symbols(hex_set("01234567")), hex_digit(), hex_digit()})}),
                            }));
  options.push_back(char_frag(b_, {{0x80, 0x10FFFF}}, StringMode::kJson));
  return b_.alt(std::move(options));
}

Frag JsonGrammar::raw_char() { return char_frag(b_, any_char(), StringMode::kRaw); }

Frag JsonGrammar::string_literal_any() {
  if (any_string_ < 0) {
    any_string_ = b_.declare_rule("string");
    b_.define(any_string_, [&] { return b_.seq({b_.literal("\""), b_.star(json_char()), b_.literal("\"")}); });
  }
  return b_.call(any_string_);
}

int32_t JsonGrammar::any_value() {
  if (any_value_ >= 0) return any_value_;
  any_value_ = b_.declare_rule("value");
  const int32_t object = any_object();
  const int32_t ws = whitespace();
  const int32_t array = b_.declare_rule("array");
  b_.define(array, [&] {
    auto item = [&] { return b_.call(any_value_); };
    auto more = [&] { return b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), item()}); };
    return b_.seq({b_.literal("["), b_.call(ws), b_.opt(b_.seq({item(), b_.star(more())})), b_.call(ws), b_.literal("]")});
  });
  b_.define(any_value_, [&] {
    return b_.alt({b_.call(object), b_.call(array), string_literal_any(), number_any(false), b_.literal("true"),
                   b_.literal("false"), b_.literal("null")});
  });
  return any_value_;
}

int32_t JsonGrammar::any_object() {
  if (any_object_ >= 0) return any_object_;
  any_object_ = b_.declare_rule("object");
  if (any_value_ < 0) any_value();  // declares the value rule the members call
  const int32_t ws = whitespace();
  b_.define(any_object_, [&] {
    auto member = [&] {
      return b_.seq({string_literal_any(), b_.call(ws), b_.literal(":"), b_.call(ws), b_.call(any_value_)});
    };
    auto more = [&] { return b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), member()}); };
    return b_.seq({b_.literal("{"), b_.call(ws), b_.opt(b_.seq({member(), b_.star(more())})), b_.call(ws), b_.literal("}")});
  });
  return any_object_;
}

Frag JsonGrammar::json_literal(const Json& value) { return b_.literal(json_text(value)); }

// ---- schemas --------------------------------------------------------------------------

Result<const Json*> JsonGrammar::resolve(const std::string& ref, const Ctx& ctx) {
  if (ref.empty() || ref[0] != '#')
    return invalid_argument(ctx.path + ".$ref: only references into this schema (\"#...\") are supported, got '" + ref + "'");
  try {
    const Json::json_pointer ptr(ref.substr(1));
    const Json& target = ctx.root->at(ptr);
    return &target;
  } catch (const nlohmann::json::exception&) {
    return invalid_argument(ctx.path + ".$ref: '" + ref + "' does not resolve in the schema");
  }
}

Result<int32_t> JsonGrammar::ref_rule(const std::string& ref, const Ctx& ctx, int depth) {
  const auto key = std::make_pair(ctx.root, ref);
  if (auto it = refs_.find(key); it != refs_.end()) return it->second;
  const Json* target = MR_TRY(resolve(ref, ctx));
  const int32_t rule = b_.declare_rule("ref " + ref);
  refs_[key] = rule;
  Status st;
  const Ctx inner{ctx.root, ref == "#" ? "#" : "#" + ref.substr(1)};
  b_.define(rule, [&] {
    auto f = schema_frag(*target, inner, 0);
    if (!f.is_ok()) {
      st = f.status();
      return b_.empty();
    }
    return *f;
  });
  if (!st.is_ok()) return st;
  return rule;
}

Result<int32_t> JsonGrammar::rule_for(const Json& schema, const Ctx& ctx, int depth) {
  const int32_t rule = b_.declare_rule(ctx.path);
  Status st;
  b_.define(rule, [&] {
    auto f = schema_frag(schema, ctx, depth);
    if (!f.is_ok()) {
      st = f.status();
      return b_.empty();
    }
    return *f;
  });
  if (!st.is_ok()) return st;
  return rule;
}

Result<Frag> JsonGrammar::schema_frag(const Json& schema, const Ctx& ctx, int depth) {
  if (depth > kMaxDepth) return invalid_argument(ctx.path + ": nested deeper than " + std::to_string(kMaxDepth) + " levels");
  if (b_.size() > kMaxNodes) return invalid_argument(ctx.path + ": the schema is too large to compile");
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return b_.call(any_value());
    return invalid_argument(ctx.path + ": the schema false matches no value");
  }
  if (!schema.is_object()) return invalid_argument(ctx.path + ": expected a JSON Schema object");
  for (const auto& [key, _] : schema.items())
    if (!handled().count(key) && !annotations().count(key))
      return invalid_argument(ctx.path + "." + key + ": not supported");

  if (auto it = schema.find("$ref"); it != schema.end()) {
    if (!it->is_string()) return invalid_argument(ctx.path + ".$ref: expected a string");
    return b_.call(MR_TRY(ref_rule(it->get<std::string>(), ctx, depth)));
  }
  if (auto it = schema.find("const"); it != schema.end()) return json_literal(*it);
  if (auto it = schema.find("enum"); it != schema.end()) {
    if (!it->is_array() || it->empty()) return invalid_argument(ctx.path + ".enum: expected a non-empty array");
    std::vector<Frag> options;
    for (const Json& v : *it) options.push_back(json_literal(v));
    return b_.alt(std::move(options));
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!it->is_array() || it->empty()) return invalid_argument(ctx.path + "." + key + ": expected a non-empty array");
    for (const char* other : {"type", "properties", "items", "allOf"})
      if (schema.contains(other))
        return invalid_argument(ctx.path + "." + key + ": combined with '" + other + "' is not supported");
    std::vector<Frag> options;
    for (size_t i = 0; i < it->size(); ++i) {
      const Ctx sub{ctx.root, ctx.path + "." + key + "[" + std::to_string(i) + "]"};
      options.push_back(b_.call(MR_TRY(rule_for((*it)[i], sub, depth + 1))));
    }
    return b_.alt(std::move(options));
  }
  if (auto it = schema.find("allOf"); it != schema.end()) {
    if (!it->is_array() || it->size() != 1)
      return invalid_argument(ctx.path + ".allOf: only a single schema is supported");
    return schema_frag((*it)[0], Ctx{ctx.root, ctx.path + ".allOf[0]"}, depth + 1);
  }

  std::vector<std::string> types;
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) {
      types.push_back(it->get<std::string>());
    } else if (it->is_array() && !it->empty()) {
      for (const Json& t : *it) {
        if (!t.is_string()) return invalid_argument(ctx.path + ".type: expected a string or an array of strings");
        types.push_back(t.get<std::string>());
      }
    } else {
      return invalid_argument(ctx.path + ".type: expected a string or an array of strings");
    }
  } else if (schema.contains("properties") || schema.contains("required") || schema.contains("additionalProperties")) {
    types = {"object"};
  } else if (schema.contains("items") || schema.contains("prefixItems")) {
    types = {"array"};
  } else if (schema.contains("pattern") || schema.contains("minLength") || schema.contains("maxLength") ||
             schema.contains("format")) {
    types = {"string"};
  } else if (schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") ||
             schema.contains("exclusiveMaximum")) {
    types = {"number"};
  } else {
    return b_.call(any_value());
  }
  std::vector<Frag> options;
  for (const std::string& t : types) options.push_back(MR_TRY(typed(schema, t, ctx, depth)));
  return options.size() == 1 ? options[0] : b_.alt(std::move(options));
}

Result<Frag> JsonGrammar::typed(const Json& schema, const std::string& type, const Ctx& ctx, int depth) {
  if (type == "object") return object(schema, ctx, depth);
  if (type == "array") return array(schema, ctx, depth);
  if (type == "string") return string(schema, ctx, StringMode::kJson);
  if (type == "integer") return number(schema, ctx, true);
  if (type == "number") return number(schema, ctx, false);
  if (type == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
  if (type == "null") return b_.literal("null");
  return invalid_argument(ctx.path + ".type: unknown type '" + type + "'");
}

Result<Frag> JsonGrammar::object(const Json& schema, const Ctx& ctx, int depth) {
  const int32_t ws = whitespace();
  const Json empty_props = Json::object();
  auto pit = schema.find("properties");
  if (pit != schema.end() && !pit->is_object()) return invalid_argument(ctx.path + ".properties: expected an object");
  const Json& props = pit != schema.end() ? *pit : empty_props;
  std::set<std::string> required;
  if (auto it = schema.find("required"); it != schema.end()) {
    if (!it->is_array()) return invalid_argument(ctx.path + ".required: expected an array of names");
    for (const Json& r : *it) {
      if (!r.is_string()) return invalid_argument(ctx.path + ".required: expected an array of names");
      required.insert(r.get<std::string>());
    }
  }
  // Declared properties in schema order, then required names the schema did not describe
  // (any value).
  std::vector<std::pair<std::string, const Json*>> members;
  static const Json kAny = true;
  for (const auto& [key, sub] : props.items()) members.push_back({key, &sub});
  for (const std::string& r : required)
    if (!props.contains(r)) members.push_back({r, &kAny});

  const Json* additional = nullptr;  // a schema for extra keys, or none
  if (auto it = schema.find("additionalProperties"); it != schema.end()) {
    if (!it->is_boolean() && !it->is_object())
      return invalid_argument(ctx.path + ".additionalProperties: expected a boolean or a schema");
    if (!(it->is_boolean() && !it->get<bool>())) additional = &*it;
  } else if (props.empty() && required.empty()) {
    additional = &kAny;  // {"type": "object"}: any object
  }
  // Extra keys could repeat a declared one and break its schema: they are generated only
  // for objects that declare no properties (maps).
  if (!members.empty()) additional = nullptr;

  int min_props = 0, max_props = -1;
  for (const char* key : {"minProperties", "maxProperties"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      return invalid_argument(ctx.path + "." + key + ": expected a non-negative integer");
    const int64_t v = it->get<int64_t>();
    if (v > kMaxUnrolled) return invalid_argument(ctx.path + "." + key + ": above " + std::to_string(kMaxUnrolled));
    (std::string(key) == "minProperties" ? min_props : max_props) = static_cast<int>(v);
  }
  if (!members.empty()) {
    if (min_props > static_cast<int>(required.size()) && min_props > 0)
      return invalid_argument(ctx.path + ".minProperties: more than the required properties is not supported");
    if (max_props >= 0 && max_props < static_cast<int>(members.size()))
      return invalid_argument(ctx.path + ".maxProperties: fewer than the declared properties is not supported");
  }

  // Two lanes through the members: E (nothing written yet) and S (something written), so
  // that commas go exactly between members whichever optional ones are left out.
  const Frag open = b_.seq({b_.literal("{"), b_.call(ws)});
  int32_t lane_e = open.end;
  int32_t lane_s = b_.make_node();
  for (size_t i = 0; i < members.size(); ++i) {
    const auto& [key, sub] = members[i];
    const Ctx sub_ctx{ctx.root, ctx.path + ".properties." + key};
    const int32_t value = MR_TRY(rule_for(*sub, sub_ctx, depth + 1));
    auto kv = [&] { return b_.seq({b_.literal(json_text(Json(key))), b_.call(ws), b_.literal(":"), b_.call(ws), b_.call(value)}); };
    const int32_t next_e = b_.make_node(), next_s = b_.make_node();
    const Frag first = kv();
    b_.connect(lane_e, first.start);
    b_.connect(first.end, next_s);
    const Frag later = b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), kv()});
    b_.connect(lane_s, later.start);
    b_.connect(later.end, next_s);
    if (!required.count(key)) {
      b_.connect(lane_e, next_e);
      b_.connect(lane_s, next_s);
    }
    lane_e = next_e;
    lane_s = next_s;
  }
  if (additional) {
    const int32_t value = MR_TRY(rule_for(*additional, Ctx{ctx.root, ctx.path + ".additionalProperties"}, depth + 1));
    auto kv = [&] { return b_.seq({string_literal_any(), b_.call(ws), b_.literal(":"), b_.call(ws), b_.call(value)}); };
    if (min_props > 0 || max_props >= 0) {
      if (min_props == 0) {
        const Frag some = b_.seq({kv(), b_.repeat([&] { return b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), kv()}); },
                                                   0, max_props < 0 ? -1 : std::max(0, max_props - 1))});
        if (max_props != 0) {
          b_.connect(lane_e, some.start);
          b_.connect(some.end, lane_s);
        }
      } else {
        const Frag some = b_.seq({kv(), b_.repeat([&] { return b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), kv()}); },
                                                   min_props - 1, max_props < 0 ? -1 : max_props - 1)});
        const int32_t only_s = b_.make_node();
        b_.connect(lane_e, some.start);
        b_.connect(some.end, only_s);
        lane_e = b_.make_node();  // empty is not enough
        lane_s = only_s;
      }
    } else {
      const Frag first = kv();
      b_.connect(lane_e, first.start);
      b_.connect(first.end, lane_s);
      const Frag later = b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), kv()});
      b_.connect(lane_s, later.start);
      b_.connect(later.end, lane_s);
    }
  }
  const Frag close = b_.seq({b_.call(ws), b_.literal("}")});
  b_.connect(lane_e, close.start);
  b_.connect(lane_s, close.start);
  return Frag{open.start, close.end};
}

Result<Frag> JsonGrammar::array(const Json& schema, const Ctx& ctx, int depth) {
  const int32_t ws = whitespace();
  std::vector<const Json*> prefix;
  if (auto it = schema.find("prefixItems"); it != schema.end()) {
    if (!it->is_array()) return invalid_argument(ctx.path + ".prefixItems: expected an array of schemas");
    for (const Json& s : *it) prefix.push_back(&s);
  }
  static const Json kAny = true;
  const Json* items = &kAny;
  bool more_allowed = true;
  if (auto it = schema.find("items"); it != schema.end()) {
    if (it->is_boolean() && !it->get<bool>()) more_allowed = false;
    else if (it->is_array()) return invalid_argument(ctx.path + ".items: an array of schemas is not supported (use prefixItems)");
    else items = &*it;
  }
  int min_items = 0, max_items = -1;
  for (const char* key : {"minItems", "maxItems"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!(it->is_number_integer() && it->get<int64_t>() >= 0))
      return invalid_argument(ctx.path + "." + key + ": expected a non-negative integer");
    const int64_t v = it->get<int64_t>();
    if (v > kMaxUnrolled) return invalid_argument(ctx.path + "." + key + ": above " + std::to_string(kMaxUnrolled) + " is not supported");
    (std::string(key) == "minItems" ? min_items : max_items) = static_cast<int>(v);
  }
  if (!more_allowed) max_items = max_items < 0 ? static_cast<int>(prefix.size()) : std::min<int>(max_items, prefix.size());
  if (max_items >= 0 && min_items > max_items)
    return invalid_argument(ctx.path + ".minItems: more than the array may hold");

  std::vector<int32_t> slot_rules;  // rules of the prefix slots, then the items rule
  for (size_t i = 0; i < prefix.size(); ++i)
    slot_rules.push_back(MR_TRY(rule_for(*prefix[i], Ctx{ctx.root, ctx.path + ".prefixItems[" + std::to_string(i) + "]"}, depth + 1)));
  int32_t items_rule = -1;
  if (more_allowed) items_rule = MR_TRY(rule_for(*items, Ctx{ctx.root, ctx.path + ".items"}, depth + 1));
  auto slot = [&](size_t j) { return b_.call(j < slot_rules.size() ? slot_rules[j] : items_rule); };
  auto element = [&](size_t j) {
    return j == 0 ? slot(0) : b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), slot(j)});
  };

  // Elements 0..n-1: the first min_items required, then optional ones, nested so that a
  // skipped element ends the list; past the prefix slots an unbounded tail is a loop.
  const size_t explicit_count = std::max<size_t>(static_cast<size_t>(min_items),
                                                 max_items < 0 ? prefix.size() : static_cast<size_t>(max_items));
  if (explicit_count > static_cast<size_t>(kMaxUnrolled))
    return invalid_argument(ctx.path + ": more than " + std::to_string(kMaxUnrolled) + " items spelled out");
  Frag tail = b_.empty();
  if (max_items < 0) tail = b_.star(b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), b_.call(items_rule)}));
  for (size_t j = explicit_count; j-- > 0;) {
    const Frag e = element(j);
    b_.connect(e.end, tail.start);
    Frag with{e.start, tail.end};
    tail = j < static_cast<size_t>(min_items) ? with : b_.opt(with);
  }
  if (explicit_count == 0 && max_items < 0) {
    // No explicit element: [ (item ("," item)*)? ]
    tail = b_.opt(b_.seq({b_.call(items_rule), b_.star(b_.seq({b_.call(ws), b_.literal(","), b_.call(ws), b_.call(items_rule)}))}));
  }
  return b_.seq({b_.literal("["), b_.call(ws), tail, b_.call(ws), b_.literal("]")});
}

Result<Frag> JsonGrammar::string(const Json& schema, const Ctx& ctx, StringMode mode) {
  int min_len = 0, max_len = -1;
  for (const char* key : {"minLength", "maxLength"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!(it->is_number_integer() && it->get<int64_t>() >= 0))
      return invalid_argument(ctx.path + "." + key + ": expected a non-negative integer");
    const int64_t v = it->get<int64_t>();
    if (v > kMaxUnrolled) return invalid_argument(ctx.path + "." + key + ": above " + std::to_string(kMaxUnrolled) + " is not supported");
    (std::string(key) == "minLength" ? min_len : max_len) = static_cast<int>(v);
  }
  if (max_len >= 0 && min_len > max_len) return invalid_argument(ctx.path + ".minLength: greater than maxLength");
  std::optional<std::string> pattern;
  if (auto it = schema.find("pattern"); it != schema.end()) {
    if (!it->is_string()) return invalid_argument(ctx.path + ".pattern: expected a string");
    pattern = it->get<std::string>();
  }
  if (auto it = schema.find("format"); it != schema.end() && it->is_string() && !pattern) {
    // The formats ajv-formats checks, as narrow regexes every match of which it accepts.
    const std::string f = it->get<std::string>();
    const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])";
    const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-2]):[0-5][0-9])";
    if (f == "date-time") pattern = "^" + date + "T" + time + "$";
    else if (f == "date") pattern = "^" + date + "$";
    else if (f == "time") pattern = "^" + time + "$";
    else if (f == "uuid") pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
    else if (f == "email") pattern = "^[a-z0-9]{1,24}(\\.[a-z0-9]{1,24})?@[a-z0-9]{1,24}\\.[a-z]{2,6}$";
  }
  if (pattern && (min_len > 0 || max_len >= 0))
    return invalid_argument(ctx.path + ".pattern: together with minLength/maxLength is not supported");
  Frag body;
  if (pattern) {
    body = MR_TRY(pattern_frag(b_, *pattern, mode, ctx.path + ".pattern"));
  } else {
    auto ch = [&] { return mode == StringMode::kJson ? json_char() : raw_char(); };
    body = b_.repeat(ch, min_len, max_len);
  }
  if (mode == StringMode::kRaw) return body;
  return b_.seq({b_.literal("\""), body, b_.literal("\"")});
}

Result<int32_t> JsonGrammar::value(const Json& schema, const Json& root, const std::string& path) {
  return rule_for(schema, Ctx{&root, path}, 0);
}

Result<int32_t> JsonGrammar::raw_string(const Json& schema, const Json& root, const std::string& path) {
  const Ctx ctx{&root, path};
  const int32_t rule = b_.declare_rule(path + " (raw)");
  Status st;
  b_.define(rule, [&] {
    Result<Frag> f = [&]() -> Result<Frag> {
      if (schema.is_object()) {
        if (auto it = schema.find("const"); it != schema.end() && it->is_string()) return b_.literal(it->get<std::string>());
        if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
          std::vector<Frag> options;
          for (const Json& v : *it)
            if (v.is_string()) options.push_back(b_.literal(v.get<std::string>()));
          if (options.empty()) return invalid_argument(path + ".enum: no string value");
          return b_.alt(std::move(options));
        }
        return string(schema, ctx, StringMode::kRaw);
      }
      return b_.star(raw_char());
    }();
    if (!f.is_ok()) {
      st = f.status();
      return b_.empty();
    }
    return *f;
  });
  if (!st.is_ok()) return st;
  return rule;
}

Result<std::vector<std::string>> JsonGrammar::types_of(const Json& schema, const Json& root, const std::string& path) {
  if (!schema.is_object()) return std::vector<std::string>{};
  if (auto it = schema.find("$ref"); it != schema.end() && it->is_string()) {
    const Json* target = MR_TRY(resolve(it->get<std::string>(), Ctx{&root, path}));
    return types_of(*target, root, path);
  }
  auto type_of_value = [](const Json& v) -> std::string {
    if (v.is_string()) return "string";
    if (v.is_boolean()) return "boolean";
    if (v.is_null()) return "null";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    if (v.is_number()) return "number";
    if (v.is_array()) return "array";
    return "object";
  };
  std::vector<std::string> out;
  if (auto it = schema.find("const"); it != schema.end()) return std::vector<std::string>{type_of_value(*it)};
  if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
    for (const Json& v : *it) out.push_back(type_of_value(v));
    return out;
  }
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) return std::vector<std::string>{it->get<std::string>()};
    if (it->is_array())
      for (const Json& t : *it)
        if (t.is_string()) out.push_back(t.get<std::string>());
    return out;
  }
  return out;
}

Result<Grammar> compile_json_schema(const Json& schema, const std::string& path) {
  Builder b;
  JsonGrammar jg(b);
  const int32_t root = MR_TRY(jg.value(schema, schema, path));
  Grammar g = b.finish(root);
  if (g.rules[root].min_length >= INT32_MAX / 8)
    return invalid_argument(path + ": no finite JSON value satisfies the schema (infinite recursion)");
  return g;
}

}  // namespace moonrun::grammar
