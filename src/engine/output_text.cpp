#include "engine/output_text.h"

#include <algorithm>

namespace moonrun {

size_t utf8_incomplete_tail(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte, then compare the length
  // the lead byte announces with the bytes present.
  const size_t n = s.size();
  size_t i = n;
  int continuation = 0;
  while (i > 0 && continuation < 4) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) break;
    --i;
    ++continuation;
  }
  if (i == 0) return 0;
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t want = 1;
  if ((lead & 0xE0) == 0xC0) want = 2;
  else if ((lead & 0xF0) == 0xE0) want = 3;
  else if ((lead & 0xF8) == 0xF0) want = 4;
  const size_t have = static_cast<size_t>(continuation) + 1;
  return have < want ? have : 0;
}

std::string to_valid_utf8(const std::string& s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  const size_t n = s.size();
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < n) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (excludes overlongs and surrogates).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    if (len == 0) {  // a continuation byte or an invalid lead: one replacement per byte
      out += kReplacement;
      ++i;
      continue;
    }
    // The longest valid prefix of the sequence (the "maximal subpart").
    size_t k = 1;
    while (k < static_cast<size_t>(len) && i + k < n) {
      const unsigned char b = byte(i + k);
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == static_cast<size_t>(len)) out.append(s, i, len);
    else out += kReplacement;
    i += k;
  }
  return out;
}

namespace {

bool ends_with_replacement_char(const std::string& s) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
}

}  // namespace

OutputText::OutputText(DetokenizeFn decode, std::vector<std::string> stop_strings, bool include_stop)
    : decode_(std::move(decode)), stops_(std::move(stop_strings)), include_stop_(include_stop) {
  for (const auto& s : stops_) max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
}

void OutputText::decode_pending(bool flush) {
  if (!decode_ || read_offset_ == ids_.size()) return;
  // Decode with the previous tokens as left context and keep the extension: a token that
  // only completes a character (or a glyph made of several tokens) shows up here.
  const std::vector<int32_t> context(ids_.begin() + prefix_offset_, ids_.begin() + read_offset_);
  const std::vector<int32_t> with_new(ids_.begin() + prefix_offset_, ids_.end());
  const std::string prefix_text = context.empty() ? std::string() : decode_(context);
  const std::string full_text = decode_(with_new);
  const bool unfinished = ends_with_replacement_char(full_text) || utf8_incomplete_tail(full_text) > 0;
  if (full_text.size() <= prefix_text.size() || (unfinished && !flush)) return;
  // Byte-level BPE always extends the context's text; a tokenizer that does not (spacing
  // rules) gets vLLM's treatment: the bytes past the context's length.
  text_ += full_text.substr(prefix_text.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
}

bool OutputText::check_stop(size_t old_size) {
  if (stops_.empty() || !matched_stop_.empty()) return false;
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& stop : stops_) {
    // A match must end in the new text, so it starts at most stop.size()-1 bytes before it.
    const size_t from = old_size >= stop.size() - 1 ? old_size - (stop.size() - 1) : 0;
    const size_t pos = text_.find(stop, from);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      best_stop = &stop;
    }
  }
  if (!best_stop) return false;
  matched_stop_ = *best_stop;
  text_.resize(best + (include_stop_ ? best_stop->size() : 0));
  sent_bytes_ = std::min(sent_bytes_, text_.size());
  return true;
}

bool OutputText::append(int32_t token) {
  ids_.push_back(token);
  const size_t old_size = text_.size();
  decode_pending(/*flush=*/false);
  return check_stop(old_size);
}

std::string OutputText::take_delta(bool finished) {
  if (finished && matched_stop_.empty()) {
    const size_t old_size = text_.size();
    decode_pending(/*flush=*/true);
    check_stop(old_size);
  }
  size_t end = text_.size();
  if (!finished) {
    // Hold back what could be the first bytes of a stop string, never splitting a character.
    const size_t hold = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
    end = end > hold ? end - hold : 0;
    while (end > sent_bytes_ && end < text_.size() &&
           (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80)
      --end;
  }
  if (end <= sent_bytes_) return {};
  std::string delta = to_valid_utf8(text_.substr(sent_bytes_, end - sent_bytes_));
  sent_bytes_ = end;
  return delta;
}

}  // namespace moonrun
