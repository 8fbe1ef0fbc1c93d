// Python-compatible JSON text; see render_json.h for why every byte matters.
#include "chat/render_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace moonrun::chat {

void append_py_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));  // ensure_ascii=False: UTF-8 passes through
        }
    }
  }
  out.push_back('"');
}

namespace {

void append_value(std::string& out, const Json& v, JsonSeparators seps) {
  const char* item_sep = seps == JsonSeparators::kCompact ? "," : ", ";
  const char* key_sep = seps == JsonSeparators::kCompact ? ":" : ": ";
  switch (v.type()) {
    case Json::value_t::null: out += "null"; break;
    case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case Json::value_t::number_float: out += py_float_repr(v.get<double>()); break;
    case Json::value_t::string: append_py_json_string(out, v.get_ref<const std::string&>()); break;
    case Json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += item_sep;
        first = false;
        append_value(out, item, seps);
      }
      out.push_back(']');
      break;
    }
    case Json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += item_sep;
        first = false;
        append_py_json_string(out, key);
        out += key_sep;
        append_value(out, item, seps);
      }
      out.push_back('}');
      break;
    }
    case Json::value_t::binary:
    case Json::value_t::discarded: out += "null"; break;
  }
}

// Decodes one UTF-8 code point at `i`; returns its length (1 for an invalid byte, with
// `cp` = -1 so that it never counts as white space).
size_t decode_utf8(std::string_view s, size_t i, int32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) { cp = -1; return 1; }
  if (len == 1) { cp = b0; return 1; }
  int32_t v = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) { cp = -1; return 1; }
    v = (v << 6) | (b & 0x3F);
  }
  cp = v;
  return len;
}

bool is_py_space(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace

std::string py_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, as Python's repr: d.ddd e±XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') { sign = "-"; sci.erase(0, 1); }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  // Python uses scientific notation when the decimal exponent is < -4 or >= 16.
  if (exp10 < -4 || exp10 >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + ebuf;
  }
  std::string out = sign;
  if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

std::string py_json_dumps(const Json& value, JsonSeparators separators) {
  std::string out;
  append_value(out, value, separators);
  return out;
}

Json deep_sorted(const Json& value) {
  if (value.is_array()) {
    Json out = Json::array();
    for (const auto& item : value) out.push_back(deep_sorted(item));
    return out;
  }
  if (!value.is_object()) return value;
  std::vector<std::string> keys;
  keys.reserve(value.size());
  for (const auto& [key, item] : value.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());  // byte order of UTF-8 == code point order
  Json out = Json::object();
  for (const auto& key : keys) out[key] = deep_sorted(value.at(key));
  return out;
}

std::string_view py_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    int32_t cp;
    const size_t len = decode_utf8(text, begin, cp);
    if (!is_py_space(cp)) break;
    begin += len;
  }
  // Scan forward, remembering where the last non-space code point ends.
  size_t end = begin;
  for (size_t i = begin; i < text.size();) {
    int32_t cp;
    const size_t len = decode_utf8(text, i, cp);
    i += len;
    if (!is_py_space(cp)) end = i;
  }
  return text.substr(begin, end - begin);
}

bool py_is_blank(std::string_view text) { return py_strip(text).empty(); }

}  // namespace moonrun::chat
