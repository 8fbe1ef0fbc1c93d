#pragma once
// Reading a request's JSON body safely, for every handler:
//  - parse_request_json() refuses nesting deeper than kMaxJsonDepth before the parser sees
//    it (a 40 KB body of 20,000 nested arrays otherwise reaches recursive code later:
//    copies, dumps, the chat layer's walk, and overflows the thread's stack);
//  - the getters read an optional field of a given type: absent or null gives the
//    default, any other type is an invalid_argument Status naming the field (a 400), never
//    an exception from the JSON library (which would be a 500).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun::server {

// Deep enough for any real tools schema or response_format (JSON Schema nests a few levels
// per property); shallow enough that recursion over it is harmless on any stack.
constexpr int kMaxJsonDepth = 64;

// The depth of the deepest array/object in text (strings are skipped, escapes honoured);
// stops counting at limit + 1. Needs no valid JSON.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// Parses body as JSON: invalid_argument "Request body is not valid JSON" or "... nested
// deeper than 64 levels" on failure.
Result<nlohmann::json> parse_request_json(std::string_view body);

// obj[key] as a boolean / string / integer / number. `where` prefixes the field name in
// messages (e.g. "stream_options.").
Result<bool> json_bool(const nlohmann::json& obj, const char* key, bool fallback, const char* where = "");
Result<std::string> json_string(const nlohmann::json& obj, const char* key, std::string fallback, const char* where = "");
Result<int64_t> json_int(const nlohmann::json& obj, const char* key, int64_t fallback, const char* where = "");
Result<double> json_number(const nlohmann::json& obj, const char* key, double fallback, const char* where = "");

// Every boolean field of every route, in one table (request_json_booleans.cpp): a path
// per field, "stream_options.include_usage" a member of an object, "tools[].function.strict"
// that member of each element of an array. A route without booleans (or unknown) has none.
const std::vector<std::string>& boolean_fields(std::string_view route);

// A field the request got wrong: its path with indices ("tools[2].function.strict") and
// the 400's message.
struct FieldError {
  std::string field;
  std::string message;
};
// The first of the route's boolean fields the body holds as something other than true,
// false or null. parse_body runs it for every route, so no handler sees a "yes".
std::optional<FieldError> check_boolean_fields(const nlohmann::json& body, std::string_view route);

// A JSON library exception (a handler read a field with the wrong type) as a 400 message
// without the library's "[json.exception.type_error.302]" prefix.
std::string json_exception_message(const std::exception& e);

}  // namespace moonrun::server
