#include "server/request_json.h"

namespace moonrun::server {

using nlohmann::json;

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > limit) return deepest;
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return deepest;
}

Result<json> parse_request_json(std::string_view body) {
  if (json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return invalid_argument("Request body is nested deeper than " + std::to_string(kMaxJsonDepth) +
                            " levels of arrays and objects; flatten it (tools and response_format schemas "
                            "rarely need more than 10).");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("Request body is not valid JSON.");
  return j;
}

namespace {
const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
Status wrong_type(const char* where, const char* key, const char* expected, const json& got) {
  return invalid_argument(std::string(where) + key + ": expected " + expected + ", got " + got.type_name());
}
}  // namespace

Result<bool> json_bool(const json& obj, const char* key, bool fallback, const char* where) {
  const json* v = field(obj, key);
  if (!v) return fallback;
  if (!v->is_boolean()) return wrong_type(where, key, "true or false", *v);
  return v->get<bool>();
}

Result<std::string> json_string(const json& obj, const char* key, std::string fallback, const char* where) {
  const json* v = field(obj, key);
  if (!v) return fallback;
  if (!v->is_string()) return wrong_type(where, key, "a string", *v);
  return v->get<std::string>();
}

Result<int64_t> json_int(const json& obj, const char* key, int64_t fallback, const char* where) {
  const json* v = field(obj, key);
  if (!v) return fallback;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  return wrong_type(where, key, "an integer", *v);
}

Result<double> json_number(const json& obj, const char* key, double fallback, const char* where) {
  const json* v = field(obj, key);
  if (!v) return fallback;
  if (!v->is_number()) return wrong_type(where, key, "a number", *v);
  return v->get<double>();
}

std::string json_exception_message(const std::exception& e) {
  std::string what = e.what();
  const size_t close = what.find("] ");
  if (what.rfind("[json.exception.", 0) == 0 && close != std::string::npos) what = what.substr(close + 2);
  return "A field of the request has the wrong type or value (" + what + ").";
}

}  // namespace moonrun::server
