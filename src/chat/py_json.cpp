// Python's json.loads / json.dumps on a value tree that keeps integers exact; see py_json.h.
#include "chat/py_json.h"

#include <cstdlib>
#include <limits>

namespace moonrun::chat {
namespace {

// Python's json module recurses once per nesting level; past ~1000 it raises RecursionError.
// 500 keeps the parser's own stack small and still far beyond any real argument object.
constexpr int kMaxDepth = 500;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  std::optional<PyJson> document() {
    skip_ws();
    auto v = value(0);
    if (!v) return std::nullopt;
    skip_ws();
    if (i_ != s_.size()) return std::nullopt;  // "Extra data"
    return v;
  }

 private:
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  std::optional<PyJson> value(int depth) {
    if (depth > kMaxDepth || i_ >= s_.size()) return std::nullopt;
    PyJson v;
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      v.kind = PyJson::Kind::kString;
      if (!string(v.text)) return std::nullopt;
      return v;
    }
    if (literal("null")) return v;
    if (literal("true") || literal("false")) {
      v.kind = PyJson::Kind::kBool;
      v.boolean = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';
      return v;
    }
    if (literal("NaN")) {
      v.kind = PyJson::Kind::kFloat;
      v.number = std::numeric_limits<double>::quiet_NaN();
      return v;
    }
    if (literal("Infinity")) {
      v.kind = PyJson::Kind::kFloat;
      v.number = std::numeric_limits<double>::infinity();
      return v;
    }
    if (literal("-Infinity")) {
      v.kind = PyJson::Kind::kFloat;
      v.number = -std::numeric_limits<double>::infinity();
      return v;
    }
    return number();
  }

  // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?  (Python's NUMBER_RE)
  std::optional<PyJson> number() {
    const size_t start = i_;
    auto digits = [&] {
      const size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size()) return std::nullopt;
    if (s_[i_] == '0') {
      ++i_;
    } else if (s_[i_] >= '1' && s_[i_] <= '9') {
      digits();
    } else {
      return std::nullopt;
    }
    bool is_float = false;
    if (i_ + 1 < s_.size() && s_[i_] == '.' && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
      ++i_;
      digits();
      is_float = true;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      size_t save = i_++;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) {
        i_ = save;  // not an exponent after all: the number ends before the 'e'
      } else {
        is_float = true;
      }
    }
    PyJson v;
    const std::string text(s_.substr(start, i_ - start));
    if (is_float) {
      v.kind = PyJson::Kind::kFloat;
      v.number = std::strtod(text.c_str(), nullptr);  // correctly rounded, as float() is
    } else {
      v.kind = PyJson::Kind::kInt;
      v.text = text == "-0" ? "0" : text;
    }
    return v;
  }

  bool hex4(uint32_t& out) {
    if (i_ + 4 > s_.size()) return false;
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      out <<= 4;
      if (c >= '0' && c <= '9') out |= c - '0';
      else if (c >= 'a' && c <= 'f') out |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') out |= c - 'A' + 10;
      else return false;
    }
    return true;
  }

  bool string(std::string& out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return false;  // strict=True: control characters must be escaped
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++i_;
        continue;
      }
      if (++i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            const size_t save = i_;
            i_ += 2;
            uint32_t lo;
            if (hex4(lo) && lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              i_ = save;
            }
          }
          // A lone surrogate has no UTF-8 form (Python keeps it, then cannot encode it).
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
          append_utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
    return false;
  }

  std::optional<PyJson> array(int depth) {
    ++i_;
    PyJson v;
    v.kind = PyJson::Kind::kArray;
    skip_ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return v;
    }
    while (true) {
      skip_ws();
      auto item = value(depth + 1);
      if (!item) return std::nullopt;
      v.items.push_back(std::move(*item));
      skip_ws();
      if (i_ >= s_.size()) return std::nullopt;
      if (s_[i_] == ']') {
        ++i_;
        return v;
      }
      if (s_[i_++] != ',') return std::nullopt;
    }
  }

  std::optional<PyJson> object(int depth) {
    ++i_;
    PyJson v;
    v.kind = PyJson::Kind::kObject;
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return v;
    }
    while (true) {
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != '"') return std::nullopt;
      std::string key;
      if (!string(key)) return std::nullopt;
      skip_ws();
      if (i_ >= s_.size() || s_[i_++] != ':') return std::nullopt;
      skip_ws();
      auto item = value(depth + 1);
      if (!item) return std::nullopt;
      v.set(std::move(key), std::move(*item));
      skip_ws();
      if (i_ >= s_.size()) return std::nullopt;
      if (s_[i_] == '}') {
        ++i_;
        return v;
      }
      if (s_[i_++] != ',') return std::nullopt;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

void dump(std::string& out, const PyJson& v, JsonSeparators seps) {
  const char* item_sep = seps == JsonSeparators::kCompact ? "," : ", ";
  const char* key_sep = seps == JsonSeparators::kCompact ? ":" : ": ";
  switch (v.kind) {
    case PyJson::Kind::kNull: out += "null"; break;
    case PyJson::Kind::kBool: out += v.boolean ? "true" : "false"; break;
    case PyJson::Kind::kInt: out += v.text; break;
    case PyJson::Kind::kFloat: out += py_float_repr(v.number); break;
    case PyJson::Kind::kString: append_py_json_string(out, v.text); break;
    case PyJson::Kind::kArray:
      out.push_back('[');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += item_sep;
        dump(out, v.items[i], seps);
      }
      out.push_back(']');
      break;
    case PyJson::Kind::kObject:
      out.push_back('{');
      for (size_t i = 0; i < v.members.size(); ++i) {
        if (i) out += item_sep;
        append_py_json_string(out, v.members[i].first);
        out += key_sep;
        dump(out, v.members[i].second, seps);
      }
      out.push_back('}');
      break;
  }
}

}  // namespace

void PyJson::set(std::string key, PyJson value) {
  for (auto& [k, v] : members) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  members.emplace_back(std::move(key), std::move(value));
}

const PyJson* PyJson::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

std::optional<PyJson> py_json_loads(std::string_view text) { return Reader(text).document(); }

std::string py_json_dumps(const PyJson& value, JsonSeparators separators) {
  std::string out;
  dump(out, value, separators);
  return out;
}

PyJson py_json_from(const Json& value) {
  PyJson v;
  switch (value.type()) {
    case Json::value_t::boolean:
      v.kind = PyJson::Kind::kBool;
      v.boolean = value.get<bool>();
      break;
    case Json::value_t::number_integer:
      v.kind = PyJson::Kind::kInt;
      v.text = std::to_string(value.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      v.kind = PyJson::Kind::kInt;
      v.text = std::to_string(value.get<uint64_t>());
      break;
    case Json::value_t::number_float:
      v.kind = PyJson::Kind::kFloat;
      v.number = value.get<double>();
      break;
    case Json::value_t::string:
      v.kind = PyJson::Kind::kString;
      v.text = value.get<std::string>();
      break;
    case Json::value_t::array:
      v.kind = PyJson::Kind::kArray;
      for (const auto& item : value) v.items.push_back(py_json_from(item));
      break;
    case Json::value_t::object:
      v.kind = PyJson::Kind::kObject;
      for (const auto& [key, item] : value.items()) v.set(key, py_json_from(item));
      break;
    default: break;  // null, binary, discarded
  }
  return v;
}

const char* py_json_xtml_type(const PyJson& value) {
  switch (value.kind) {
    case PyJson::Kind::kBool: return "boolean";
    case PyJson::Kind::kNull: return "null";
    case PyJson::Kind::kInt:
    case PyJson::Kind::kFloat: return "number";
    case PyJson::Kind::kString: return "string";
    case PyJson::Kind::kObject: return "object";
    case PyJson::Kind::kArray: return "array";
  }
  return "null";
}

}  // namespace moonrun::chat
