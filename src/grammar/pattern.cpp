// ECMA regex subset -> grammar fragment; see pattern.h.
#include "grammar/pattern.h"

#include <algorithm>
#include <functional>

namespace moonrun::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;

CharSet normalize(CharSet s) {
  std::sort(s.begin(), s.end());
  CharSet out;
  for (const auto& r : s) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CharSet without_surrogates(const CharSet& s) {
  CharSet out;
  for (auto [lo, hi] : s) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) out.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) out.push_back({0xE000, hi});
  }
  return out;
}

CharSet complement(const CharSet& s) {
  CharSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalize(s)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return without_surrogates(out);
}

CharSet digit_set() { return {{'0', '9'}}; }
CharSet word_set() { return normalize({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'_', '_'}}); }
CharSet space_set() {  // ECMA \s: WhiteSpace and LineTerminator
  return normalize({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                    {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
}
CharSet dot_set() { return complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

void encode_utf8(uint32_t cp, uint8_t* out, int& n) {
  if (cp < 0x80) { out[0] = static_cast<uint8_t>(cp); n = 1; }
  else if (cp < 0x800) { out[0] = 0xC0 | (cp >> 6); out[1] = 0x80 | (cp & 0x3F); n = 2; }
  else if (cp < 0x10000) { out[0] = 0xE0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 0x3F); out[2] = 0x80 | (cp & 0x3F); n = 3; }
  else { out[0] = 0xF0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 0x3F); out[2] = 0x80 | ((cp >> 6) & 0x3F); out[3] = 0x80 | (cp & 0x3F); n = 4; }
}

// A range of code points of one encoded length, split until every byte position is a
// plain byte range (the classic UTF-8 range construction).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], z[4];
  int na, nz;
  encode_utf8(lo, a, na);
  encode_utf8(hi, z, nz);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int k = 0; k < na; ++k) seq.push_back({a[k], z[k]});
  out.push_back(std::move(seq));
}

// The JSON escape of an ASCII character that cannot appear raw in a JSON string.
std::string json_escape(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: {
      static const char* hex = "0123456789abcdef";
      return std::string("\\u00") + hex[c >> 4] + hex[c & 15];
    }
  }
}

struct Re {
  enum class Kind { kSet, kCat, kAlt, kRep };
  Kind kind = Kind::kCat;
  CharSet set;
  std::vector<Re> kids;
  int min = 0, max = 0;  // kRep; max < 0: unbounded
};

class Parser {
 public:
  Parser(std::string_view s, std::string path) : s_(s), path_(std::move(path)) {}

  Result<Re> parse() {
    auto r = alternation();
    if (!r.is_ok()) return r;
    if (i_ != s_.size()) return error("unbalanced ')'");
    return r;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument(path_ + ": " + what + " (at offset " + std::to_string(i_) + " of the pattern) is not supported");
  }
  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }

  Result<Re> alternation() {
    Re alt{Re::Kind::kAlt};
    while (true) {
      Re seq = MR_TRY(sequence());
      alt.kids.push_back(std::move(seq));
      if (!at('|')) break;
      ++i_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Result<Re> sequence() {
    Re cat{Re::Kind::kCat};
    while (i_ < s_.size() && !at('|') && !at(')')) {
      if (at('^')) {
        if (i_ != 0) return error("'^' inside the pattern");
        ++i_;
        continue;
      }
      if (at('$')) {
        if (i_ + 1 != s_.size()) return error("'$' inside the pattern");
        ++i_;
        continue;
      }
      Re a = MR_TRY(atom());
      a = MR_TRY(quantified(std::move(a)));
      cat.kids.push_back(std::move(a));
    }
    return cat;
  }

  Result<int> count() {
    size_t start = i_;
    long v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_++] - '0');
      if (v > kMaxRepeat) return error("a repetition count above " + std::to_string(kMaxRepeat));
    }
    if (i_ == start) return -1;
    return static_cast<int>(v);
  }

  Result<Re> quantified(Re a) {
    while (i_ < s_.size()) {
      int min, max;
      const size_t save = i_;
      if (at('*')) { min = 0; max = -1; ++i_; }
      else if (at('+')) { min = 1; max = -1; ++i_; }
      else if (at('?')) { min = 0; max = 1; ++i_; }
      else if (at('{')) {
        ++i_;
        min = MR_TRY(count());
        if (min < 0) { i_ = save; return a; }  // a literal '{'
        max = min;
        if (at(',')) {
          ++i_;
          max = MR_TRY(count());
        }
        if (!at('}')) { i_ = save; return a; }
        ++i_;
        if (max >= 0 && max < min) return error("a repetition {n,m} with m < n");
      } else {
        return a;
      }
      if (at('?')) ++i_;  // lazy: the same language
      Re rep{Re::Kind::kRep};
      rep.min = min;
      rep.max = max;
      rep.kids.push_back(std::move(a));
      a = std::move(rep);
    }
    return a;
  }

  uint32_t utf8_at() {
    const auto b0 = static_cast<unsigned char>(s_[i_]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 1;
    if (i_ + len > s_.size()) len = 1;
    uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[i_ + k]) & 0x3F);
    i_ += len;
    return cp;
  }

  Result<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return error("a malformed hex escape");
      const char c = s_[i_++];
      v = v * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return v;
  }

  // An escape after '\': a class (\d ...) or one character.
  Result<CharSet> escape(bool in_class) {
    if (i_ >= s_.size()) return error("a trailing '\\'");
    const char c = s_[i_++];
    switch (c) {
      case 'd': return digit_set();
      case 'D': return complement(digit_set());
      case 'w': return word_set();
      case 'W': return complement(word_set());
      case 's': return space_set();
      case 'S': return complement(space_set());
      case 'n': return CharSet{{'\n', '\n'}};
      case 'r': return CharSet{{'\r', '\r'}};
      case 't': return CharSet{{'\t', '\t'}};
      case 'f': return CharSet{{'\f', '\f'}};
      case 'v': return CharSet{{'\v', '\v'}};
      case '0': return CharSet{{0, 0}};
      case 'x': {
        const uint32_t v = MR_TRY(hex(2));
        return CharSet{{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (at('{')) {
          ++i_;
          v = 0;
          while (i_ < s_.size() && !at('}')) v = v * 16 + MR_TRY(hex(1));
          if (!at('}')) return error("an unterminated \\u{...}");
          ++i_;
        } else {
          v = MR_TRY(hex(4));
        }
        return CharSet{{v, v}};
      }
      case 'b':
        if (in_class) return CharSet{{'\b', '\b'}};
        return error("a word boundary \\b");
      case 'B': return error("\\B");
      default:
        if (c >= '1' && c <= '9') return error("a backreference");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return error(std::string("the escape \\") + c);
        --i_;
        const uint32_t cp = utf8_at();
        return CharSet{{cp, cp}};
    }
  }

  Result<CharSet> char_class() {
    ++i_;  // '['
    bool negate = false;
    if (at('^')) { negate = true; ++i_; }
    CharSet set;
    bool first = true;
    while (i_ < s_.size() && (!at(']') || first)) {
      first = false;
      CharSet lo_set;
      if (at('\\')) {
        ++i_;
        lo_set = MR_TRY(escape(true));
      } else {
        const uint32_t cp = utf8_at();
        lo_set = {{cp, cp}};
      }
      // a-z: both ends single characters
      if (at('-') && i_ + 1 < s_.size() && s_[i_ + 1] != ']' && lo_set.size() == 1 && lo_set[0].first == lo_set[0].second) {
        ++i_;
        CharSet hi_set;
        if (at('\\')) {
          ++i_;
          hi_set = MR_TRY(escape(true));
        } else {
          const uint32_t cp = utf8_at();
          hi_set = {{cp, cp}};
        }
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second) return error("a class range ending in a class");
        if (hi_set[0].first < lo_set[0].first) return error("a class range out of order");
        set.push_back({lo_set[0].first, hi_set[0].first});
        continue;
      }
      set.insert(set.end(), lo_set.begin(), lo_set.end());
    }
    if (!at(']')) return error("an unterminated '['");
    ++i_;
    set = without_surrogates(normalize(set));
    return negate ? complement(set) : set;
  }

  Result<Re> atom() {
    Re r{Re::Kind::kSet};
    if (at('(')) {
      ++i_;
      if (at('?')) {
        ++i_;
        if (at(':')) {
          ++i_;
        } else if (at('<') && i_ + 1 < s_.size() && s_[i_ + 1] != '=' && s_[i_ + 1] != '!') {
          while (i_ < s_.size() && !at('>')) ++i_;
          ++i_;
        } else {
          return error("a lookaround or inline flag group");
        }
      }
      Re inner = MR_TRY(alternation());
      if (!at(')')) return error("an unterminated '('");
      ++i_;
      return inner;
    }
    if (at('[')) {
      r.set = MR_TRY(char_class());
      return r;
    }
    if (at('.')) {
      ++i_;
      r.set = dot_set();
      return r;
    }
    if (at('\\')) {
      ++i_;
      r.set = MR_TRY(escape(false));
      return r;
    }
    if (at('*') || at('+') || at('?')) return error("a quantifier with nothing to repeat");
    const uint32_t cp = utf8_at();
    r.set = {{cp, cp}};
    return r;
  }

  std::string_view s_;
  std::string path_;
  size_t i_ = 0;
};

Builder::Frag emit(Builder& b, const Re& r, StringMode mode) {
  switch (r.kind) {
    case Re::Kind::kSet: return char_frag(b, r.set, mode);
    case Re::Kind::kCat: {
      std::vector<Builder::Frag> parts;
      for (const Re& k : r.kids) parts.push_back(emit(b, k, mode));
      return b.seq(std::move(parts));
    }
    case Re::Kind::kAlt: {
      std::vector<Builder::Frag> options;
      for (const Re& k : r.kids) options.push_back(emit(b, k, mode));
      return b.alt(std::move(options));
    }
    case Re::Kind::kRep: return b.repeat([&] { return emit(b, r.kids[0], mode); }, r.min, r.max);
  }
  return b.empty();
}

}  // namespace

CharSet any_char() { return complement({}); }

Builder::Frag char_frag(Builder& b, const CharSet& set, StringMode mode) {
  std::vector<Builder::Frag> options;
  SymbolSet raw_ascii;
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : without_surrogates(set)) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) {
      const bool needs_escape = mode == StringMode::kJson && (c < 0x20 || c == '"' || c == '\\');
      if (needs_escape) {
        options.push_back(b.literal(json_escape(c)));
      } else {
        raw_ascii.set(c);
      }
    }
    if (hi >= 0x80) utf8_sequences(std::max<uint32_t>(lo, 0x80), hi, seqs);
  }
  if (raw_ascii.any()) options.push_back(b.symbols(raw_ascii));
  for (const auto& seq : seqs) {
    std::vector<Builder::Frag> bytes;
    for (auto [lo, hi] : seq) bytes.push_back(b.byte_range(lo, hi));
    options.push_back(b.seq(std::move(bytes)));
  }
  if (options.size() == 1) return options[0];
  return b.alt(std::move(options));
}

// How many character positions the regex spells out once repetitions are unrolled: a
// pattern like (a{1000}){1000} would build a million copies, so it is refused up front.
double unrolled_size(const Re& r) {
  switch (r.kind) {
    case Re::Kind::kSet: return 1;
    case Re::Kind::kCat:
    case Re::Kind::kAlt: {
      double n = 1;
      for (const Re& k : r.kids) n += unrolled_size(k);
      return n;
    }
    case Re::Kind::kRep: return unrolled_size(r.kids[0]) * std::max(1, r.max < 0 ? r.min + 1 : r.max);
  }
  return 1;
}

Result<Builder::Frag> pattern_frag(Builder& b, std::string_view pattern, StringMode mode, const std::string& path) {
  Re re = MR_TRY(Parser(pattern, path).parse());
  if (unrolled_size(re) > 20000)
    return invalid_argument(path + ": the pattern's repetitions spell out more than 20000 characters, which is not supported");
  // Unanchored sides may hold any text (JSON Schema patterns match anywhere).
  const bool anchored_start = !pattern.empty() && pattern.front() == '^';
  const bool anchored_end = !pattern.empty() && pattern.back() == '$' && (pattern.size() < 2 || pattern[pattern.size() - 2] != '\\');
  std::vector<Builder::Frag> parts;
  const CharSet any = any_char();
  if (!anchored_start) parts.push_back(b.star(char_frag(b, any, mode)));
  parts.push_back(emit(b, re, mode));
  if (!anchored_end) parts.push_back(b.star(char_frag(b, any, mode)));
  return b.seq(std::move(parts));
}

}  // namespace moonrun::grammar
