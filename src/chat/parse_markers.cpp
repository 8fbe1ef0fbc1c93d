#include "chat/parse_markers.h"

namespace moonrun::chat {

MarkerLexer::MarkerLexer(std::vector<std::string> markers) : markers_(std::move(markers)) {}

void MarkerLexer::emit_text(std::string_view text, std::vector<MarkerPiece>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().marker < 0) {
    out.back().text += text;
  } else {
    out.push_back({-1, std::string(text)});
  }
}

void MarkerLexer::feed(std::string_view chunk, std::vector<MarkerPiece>& out) {
  pending_ += chunk;
  const std::string_view s = pending_;
  size_t text_start = 0;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string_view::npos) {
    const std::string_view rest = s.substr(i);
    int full = -1;
    bool partial = false;
    for (size_t m = 0; m < markers_.size(); ++m) {
      const std::string& mk = markers_[m];
      if (rest.size() >= mk.size()) {
        if (rest.compare(0, mk.size(), mk) == 0) { full = static_cast<int>(m); break; }
      } else if (mk.compare(0, rest.size(), rest) == 0) {
        partial = true;
      }
    }
    if (full >= 0) {
      emit_text(s.substr(text_start, i - text_start), out);
      out.push_back({full, markers_[full]});
      i += markers_[full].size();
      text_start = i;
    } else if (partial) {
      emit_text(s.substr(text_start, i - text_start), out);
      pending_ = std::string(rest);
      return;
    } else {
      ++i;
    }
  }
  emit_text(s.substr(text_start), out);
  pending_.clear();
}

void MarkerLexer::finish(std::vector<MarkerPiece>& out) {
  // A held tail is a proper prefix of some marker. One that already reads "<|" is a
  // special token cut off by the end of the stream: it is dropped, never passed on as
  // text. A shorter one ("<", "<th") is ordinary text after all.
  if (pending_.compare(0, 2, "<|") != 0) emit_text(pending_, out);
  pending_.clear();
}

}  // namespace moonrun::chat
