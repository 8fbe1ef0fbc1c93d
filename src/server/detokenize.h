#pragma once
// The engine's detokenizer hook (engine/output_text.h's DetokenizeFn) over the K3 tokenizer,
// built here where the tokenizer is known: the engine itself never sees chat/. decode_text() turns
// ill-formed UTF-8 into U+FFFD (tiktoken's errors="replace"), so every delta the engine
// hands out is valid UTF-8 (safe for JSON), and an unfinished character at the end shows
// up as a trailing U+FFFD, which OutputText holds back until the next token completes it.
// Special tokens come out as their names: the reasoning and tool-call parsers need them.
#include <memory>
#include <vector>

#include "chat/tokenizer.h"
#include "engine/output_text.h"

namespace moonrun {

inline DetokenizeFn detokenize_with(std::shared_ptr<const chat::Tokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](const std::vector<int32_t>& ids) {
    const std::vector<uint32_t> u(ids.begin(), ids.end());
    return tokenizer->decode_text(u);
  };
}

}  // namespace moonrun
