#pragma once
// Splits streamed text into literal text and markers (special-token spellings such as
// "<|open|>"). A chunk's tail that is a proper prefix of a marker is held back until the
// next chunk settles it, so a marker split across tokens is still seen whole and no half
// marker is ever passed on as text.
#include <string>
#include <string_view>
#include <vector>

namespace moonrun::chat {

struct MarkerPiece {
  int marker = -1;   // index into the lexer's marker list; -1 for literal text
  std::string text;  // the literal text, or the marker's spelling
};

class MarkerLexer {
 public:
  explicit MarkerLexer(std::vector<std::string> markers);
  void feed(std::string_view chunk, std::vector<MarkerPiece>& out);
  void finish(std::vector<MarkerPiece>& out);  // a held-back tail is literal text after all

 private:
  void emit_text(std::string_view text, std::vector<MarkerPiece>& out);

  std::vector<std::string> markers_;
  std::string pending_;
};

}  // namespace moonrun::chat
