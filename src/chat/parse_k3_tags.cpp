// K3 tag headers: attributes in the manner of the peers' (\w+)="([^"]*)" scan, and the
// leftover of a marker that is not a tag (SGLang's _CHANNEL_MARKER_RE, then the bare
// special tokens).
#include "chat/parse_k3_tags.h"

namespace moonrun::chat::k3 {
namespace {

// The channel names SGLang strips along with a quoted marker. Not "json": a quoted
// <|open|>json keeps its name there.
constexpr std::string_view kChannelNames[] = {"think", "response", "tools", "message", "call", "argument"};

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's \w on str: letters, digits and _ of any script; a UTF-8 byte of a multi-byte
// character stands in for its letter.
bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string unescape_attr(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    if (v.compare(i, 5, "&amp;") == 0) { out.push_back('&'); i += 5; }
    else if (v.compare(i, 6, "&quot;") == 0) { out.push_back('"'); i += 6; }
    else out.push_back(v[i++]);
  }
  return out;
}

// key="value" pairs, in the manner of vLLM's (\w+)="([^"]*)" scan: anything that is not
// such a pair (unknown junk, a stray quote) is skipped.
Attrs parse_attrs(std::string_view s) {
  Attrs out;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_word(s[i])) { ++i; continue; }
    size_t k = i;
    while (k < s.size() && is_word(s[k])) ++k;
    if (k + 1 < s.size() && s[k] == '=' && s[k + 1] == '"') {
      const size_t close = s.find('"', k + 2);
      if (close != std::string_view::npos) {
        out.emplace_back(std::string(s.substr(i, k - i)), unescape_attr(s.substr(k + 2, close - k - 2)));
        i = close + 1;
        continue;
      }
    }
    i = k;
  }
  return out;
}

// Matches \s+\w+ at h[pos]: the end of the word, else npos.
size_t spaced_word_end(std::string_view h, size_t pos) {
  size_t p = pos;
  while (p < h.size() && is_ascii_space(h[p])) ++p;
  if (p == pos) return std::string_view::npos;
  size_t q = p;
  while (q < h.size() && is_word(h[q])) ++q;
  return q == p ? std::string_view::npos : q;
}

}  // namespace

Tag make_tag(bool open, std::string_view header) {
  Tag t;
  t.open = open;
  t.header = std::string(header);
  t.raw = std::string(open ? "<|open|>" : "<|close|>") + t.header + "<|sep|>";
  const std::string_view h = trim(header);
  const size_t name_end = std::min(h.size(), h.find_first_of(" \t\n\r\f\v"));
  t.name = std::string(h.substr(0, name_end));
  t.bare = name_end == h.size();
  if (!t.bare) t.attrs = parse_attrs(h.substr(name_end));
  return t;
}

std::string attr(const Attrs& attrs, std::string_view key, std::string fallback) {
  for (auto it = attrs.rbegin(); it != attrs.rend(); ++it)
    if (it->first == key) return it->second;
  return fallback;
}

std::string header_leftover(std::string_view h, bool complete) {
  // A complete tag may have white space around its name (vLLM reads "<|open|> tools
  // <|sep|>" as the tag); a cut-off one is matched as SGLang matches it, name first.
  if (complete) h = trim(h);
  for (std::string_view name : kChannelNames) {
    if (h.substr(0, name.size()) != name) continue;
    size_t pos = name.size();
    // (\s+\w+="[^"]*")*
    for (;;) {
      const size_t word_end = spaced_word_end(h, pos);
      if (word_end == std::string_view::npos || h.substr(word_end, 2) != "=\"") break;
      const size_t close = h.find('"', word_end + 2);
      if (close == std::string_view::npos) break;
      pos = close + 1;
    }
    // Cut off: a last \s+\w+ or \s+\w+="... running to the end goes too.
    if (!complete) {
      const size_t word_end = spaced_word_end(h, pos);
      if (word_end != std::string_view::npos &&
          (word_end == h.size() ||
           (h.substr(word_end, 2) == "=\"" && h.find('"', word_end + 2) == std::string_view::npos)))
        pos = h.size();
    }
    return std::string(h.substr(pos));
  }
  if (!complete)
    for (std::string_view name : kChannelNames)
      if (h.size() < name.size() && name.substr(0, h.size()) == h) return "";
  return std::string(h);
}

bool starts_call_syntax(std::string_view header) {
  return header.size() > 4 && header.substr(0, 4) == "call" && is_ascii_space(header[4]);
}

}  // namespace moonrun::chat::k3
