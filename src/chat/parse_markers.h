#pragma once
// Splits streamed text into literal text and markers (special-token spellings such as
// "<|open|>"). A chunk's tail that is a proper prefix of a marker is held back until the
// next chunk settles it, so a marker split across tokens is still seen whole and no half
// marker is ever passed on as text.
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse_message.h"

namespace moonrun::chat {

struct MarkerPiece {
  int marker = -1;   // index into the lexer's marker list; -1 for literal text
  std::string text;  // the literal text, or the marker's spelling
};

class MarkerLexer {
 public:
  explicit MarkerLexer(std::vector<std::string> markers);
  void feed(std::string_view chunk, std::vector<MarkerPiece>& out);
  // The stream ended: a held-back tail is literal text after all, unless it reads "<|".
  void finish(std::vector<MarkerPiece>& out);

 private:
  void emit_text(std::string_view text, std::vector<MarkerPiece>& out);

  std::vector<std::string> markers_;
  std::string pending_;
};

// A CompletionParser driven by a MarkerLexer (the K2 and K3 parsers): feed() and finish()
// lex their text and hand each piece to on_piece() while out_ points at the call's delta;
// finish() then calls on_finish() for what an unterminated message leaves behind.
class MarkerDrivenParser : public CompletionParser {
 public:
  ParseDelta feed(std::string_view text) final {
    ParseDelta out;
    out_ = &out;
    pieces_.clear();
    lexer_.feed(text, pieces_);
    for (const auto& p : pieces_) on_piece(p);
    out_ = nullptr;
    return out;
  }

  ParseDelta finish() final {
    ParseDelta out;
    out_ = &out;
    pieces_.clear();
    lexer_.finish(pieces_);
    for (const auto& p : pieces_) on_piece(p);
    on_finish();
    out_ = nullptr;
    return out;
  }

 protected:
  explicit MarkerDrivenParser(std::vector<std::string> markers) : lexer_(std::move(markers)) {}
  virtual void on_piece(const MarkerPiece& p) = 0;
  virtual void on_finish() = 0;

  ParseDelta* out_ = nullptr;  // the delta of the feed()/finish() call in progress

 private:
  MarkerLexer lexer_;
  std::vector<MarkerPiece> pieces_;
};

}  // namespace moonrun::chat
