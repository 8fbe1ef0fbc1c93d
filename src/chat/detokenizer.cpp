#include "chat/detokenizer.h"

#include "chat/tokenizer_utf8.h"

namespace moonrun::chat {

std::string Detokenizer::push(uint32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  return push_bytes(tokenizer_->token_bytes(id));
}

std::string Detokenizer::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    size_t sub = 0;
    const size_t len = utf8_sequence_length(p + i, n - i, &sub);
    if (len) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + sub == n && utf8_is_incomplete_prefix(p + i, n - i)) {
      break;  // may still complete: hold back
    } else {
      out.append("\xEF\xBF\xBD");
      i += sub;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = utf8_replace_invalid(pending_);
  pending_.clear();
  return out;
}

}  // namespace moonrun::chat
