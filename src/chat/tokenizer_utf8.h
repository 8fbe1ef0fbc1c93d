#pragma once
// UTF-8 decoding helpers shared by the tokenizer, the detokenizer and the BPE trainer.
// Validity follows Unicode 15 §3.9 Table 3-7 (well-formed byte sequences): no overlong
// forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moonrun::chat {

// Length of the well-formed UTF-8 sequence starting at p[0] (1..4), or 0 when the bytes
// at p do not start one (invalid lead byte, bad continuation, or truncated at n).
// When it returns 0, *maximal_subpart (if given) is the length of the maximal subpart of
// an ill-formed sequence (Unicode §3.9 "U+FFFD substitution of maximal subparts"): the
// longest prefix that could still have begun a well-formed sequence, at least 1.
inline size_t utf8_sequence_length(const unsigned char* p, size_t n, size_t* maximal_subpart = nullptr) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    if (maximal_subpart) *maximal_subpart = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < need && i < n; ++i) {
    const unsigned char b = p[i];
    const unsigned char l = (i == 1) ? lo : 0x80, h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (i == need) return need;
  if (maximal_subpart) *maximal_subpart = i;
  return 0;
}

// True when p[0..n) is a proper prefix of some well-formed sequence (a tail that more
// bytes could still complete). Used by the streaming detokenizer to hold bytes back.
inline bool utf8_is_incomplete_prefix(const unsigned char* p, size_t n) {
  if (n == 0) return false;
  size_t sub = 0;
  if (utf8_sequence_length(p, n, &sub) != 0) return false;
  // Ill-formed only because it ran out of bytes: the maximal subpart is everything.
  if (sub != n) return false;
  const unsigned char b0 = p[0];
  const size_t need = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  return b0 >= 0xC2 && b0 <= 0xF4 && n < need;
}

// Decodes the well-formed sequence of `len` bytes at p (len from utf8_sequence_length).
inline uint32_t utf8_decode(const unsigned char* p, size_t len) {
  switch (len) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
}

// Replaces each maximal subpart of an ill-formed sequence with U+FFFD, exactly as
// Python's bytes.decode("utf-8", "replace") and WHATWG's decoder do.
inline std::string utf8_replace_invalid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    size_t sub = 0;
    const size_t len = utf8_sequence_length(p + i, n - i, &sub);
    if (len) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += sub;
    }
  }
  return out;
}

// Cuts bytes into maximal runs of well-formed UTF-8 and maximal runs of ill-formed bytes,
// calling on_run(std::string_view run, bool well_formed) for each, left to right.
template <typename Fn>
void for_each_utf8_run(std::string_view bytes, Fn&& on_run) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t run_start = 0;
  bool run_valid = true;
  size_t i = 0;
  while (i < n) {
    size_t len;
    bool valid;
    if (p[i] < 0x80) {
      len = 1;
      valid = true;
    } else {
      size_t sub = 0;
      len = utf8_sequence_length(p + i, n - i, &sub);
      valid = len != 0;
      if (!valid) len = sub;
    }
    if (valid != run_valid) {
      if (i > run_start) on_run(bytes.substr(run_start, i - run_start), run_valid);
      run_start = i;
      run_valid = valid;
    }
    i += len;
  }
  if (n > run_start) on_run(bytes.substr(run_start, n - run_start), run_valid);
}

// Python's str.isspace(): bidirectional class WS, B or S, or general category Zs. This is
// what tokenization_kimi.py's run splitting tests, and it differs from regex \s
// (it includes U+001C..U+001F).
inline bool python_isspace(uint32_t cp) {
  if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace moonrun::chat
