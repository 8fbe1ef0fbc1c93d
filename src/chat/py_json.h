#pragma once
// JSON values as Python's json module reads and writes them, for the places where the chat
// formats re-serialise JSON that came from text: tool-call arguments in a request (the K3
// encoder json.loads() them and json.dumps() each value into the prompt) and typed argument
// values in a K3 completion (vLLM's parser json.loads() them and json.dumps() the object).
//
// nlohmann::json cannot stand in here: it turns an integer beyond 64 bits into a double
// (123456789012345678901234567890 -> 1.2345678901234568e+29) and rejects NaN/Infinity,
// which Python accepts and writes back unchanged. PyJson keeps integers as their decimal
// text (Python ints are unbounded) and parses floats the way float() does, so
//   py_json_dumps(py_json_loads(text))
// is byte for byte what `json.dumps(json.loads(text), ensure_ascii=False)` gives.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/render_json.h"

namespace moonrun::chat {

struct PyJson {
  enum class Kind { kNull, kBool, kInt, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;      // kInt: decimal digits with an optional '-'; kString: the UTF-8 value
  double number = 0.0;   // kFloat
  std::vector<PyJson> items;                             // kArray
  std::vector<std::pair<std::string, PyJson>> members;   // kObject, insertion order

  // Python dict semantics: a repeated key keeps its first position and takes the last value.
  void set(std::string key, PyJson value);
  const PyJson* find(std::string_view key) const;
};

// json.loads(text): nullopt where Python raises (syntax error, trailing data, control
// characters inside strings, nesting deeper than 500).
std::optional<PyJson> py_json_loads(std::string_view text);

// json.dumps(value, ensure_ascii=False, separators=...).
std::string py_json_dumps(const PyJson& value, JsonSeparators separators);

// The same value from a request body that nlohmann already parsed (an `arguments` object).
PyJson py_json_from(const Json& value);

// The K3 XTML type name of a value: boolean, null, number, string, object or array.
const char* py_json_xtml_type(const PyJson& value);

}  // namespace moonrun::chat
