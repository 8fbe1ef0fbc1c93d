#pragma once
// The text side of one generated sequence: incremental detokenisation (emit a text delta
// per token without splitting a UTF-8 character or a multi-token glyph), stop strings
// (matched across token boundaries; the output text ends right before the match, as in the
// OpenAI API), and holding back the tail that could still become a stop string so that a
// streamed client never sees half of one.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moonrun {

// Decodes token ids to UTF-8 text (the tokenizer's decode, special tokens skipped). The
// incremental logic below only needs decode(ids[a:]) to extend decode(ids[a:b]), which holds
// for byte-level BPE. An unfinished UTF-8 sequence may come back as raw bytes or U+FFFD.
using DetokenizeFn = std::function<std::string(const std::vector<int32_t>&)>;

class OutputText {
 public:
  // decode may be empty (no tokenizer): the text stays empty and stop strings never match.
  // include_stop: the text ends after a matched stop string instead of before it (vLLM's
  // include_stop_str_in_output).
  OutputText(DetokenizeFn decode, std::vector<std::string> stop_strings, bool include_stop = false);
  OutputText() = default;

  // Adds one generated token. Returns true when a stop string completed: text() is then cut
  // right before it (after it with include_stop) and matched_stop() names it.
  bool append(int32_t token);
  // The text not yet handed out that is safe to hand out now; with finished, everything
  // left (flushing an unfinished UTF-8 tail too). Always valid UTF-8.
  std::string take_delta(bool finished);

  const std::string& text() const { return text_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  DetokenizeFn decode_;
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  size_t max_stop_bytes_ = 0;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) decode to text already emitted,
  size_t read_offset_ = 0;    // kept as left context for the next decode
  std::string text_;
  size_t sent_bytes_ = 0;
  std::string matched_stop_;

  void decode_pending(bool flush);
  bool check_stop(size_t old_size);
};

// s with every ill-formed UTF-8 subsequence replaced by U+FFFD (per maximal subpart, as
// Unicode recommends and tiktoken's errors="replace" does): what the engine hands out is
// always valid UTF-8, whatever the detokenizer returns, so JSON encoding cannot fail.
std::string to_valid_utf8(const std::string& s);

// Number of trailing bytes of s that form an unfinished UTF-8 character (0 when s ends on a
// character boundary).
size_t utf8_incomplete_tail(const std::string& s);

}  // namespace moonrun
