#pragma once
// Streaming detokenization: token ids in, UTF-8 text out, one step at a time, such that no
// step ever emits a broken UTF-8 sequence. A token can end in the middle of a character
// (byte-level BPE splits multi-byte characters freely), so the incomplete tail is held back
// until the bytes that complete it arrive. Ill-formed bytes become U+FFFD, one per maximal
// subpart, as soon as they are known to be ill-formed.
//
// Invariant: the concatenation of every push() and the final flush() equals
// utf8_replace_invalid(tokenizer.decode(ids)) (with skipped special tokens left out of ids).
#include <cstdint>
#include <string>
#include <string_view>

#include "chat/tokenizer.h"

namespace moonrun::chat {

class Detokenizer {
 public:
  // skip_special: special tokens produce no text (what a chat response wants; the parsers
  // see ids or the raw text instead).
  explicit Detokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // Text that became complete with this token (may be empty).
  std::string push(uint32_t id);
  // Raw bytes in (for callers that already hold token bytes).
  std::string push_bytes(std::string_view bytes);
  // End of stream: the held-back tail, as U+FFFD when it never completed.
  std::string flush();

  // Bytes currently held back (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace moonrun::chat
