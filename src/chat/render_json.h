#pragma once
// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it.
//
// The chat formats were defined by Python code: the K3 encoder writes tool declarations and
// response schemas with `separators=(",", ":")` after sorting keys recursively, argument
// values and parsed tool-call arguments with the default separators (", ", ": ") in
// insertion order, and the K2 template's `tojson` is the same default dump. Every byte of
// those dumps is part of the prompt, so floats follow Python's repr (shortest round trip,
// "1.0", "1e-05", "1e+16"), strings escape only `"`, `\` and control characters, and
// object order is the order the request gave (nlohmann::ordered_json keeps it).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moonrun::chat {

using Json = nlohmann::ordered_json;

enum class JsonSeparators {
  kCompact,        // (",", ":")
  kPythonDefault,  // (", ", ": ")
};

std::string py_json_dumps(const Json& value, JsonSeparators separators);

// A JSON string literal as json.dumps(ensure_ascii=False) writes it, appended to out.
void append_py_json_string(std::string& out, std::string_view s);

// Python's repr() of a float as json.dumps writes it ("NaN", "Infinity" for non-finite).
std::string py_float_repr(double value);

// Objects with their keys sorted by code point, recursively (Python's sorted() on str keys;
// UTF-8 byte order is code point order).
Json deep_sorted(const Json& value);

// Python's str.strip() == "" : true when `text` is empty or only Unicode white space
// (str.isspace), decoding UTF-8; an invalid byte counts as a non-space character.
bool py_is_blank(std::string_view text);

// Python's str.strip(): removes leading and trailing Unicode white space.
std::string_view py_strip(std::string_view text);

}  // namespace moonrun::chat
