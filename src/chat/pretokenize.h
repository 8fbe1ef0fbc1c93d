#pragma once
// Pre-tokenisation: the regex that cuts text into pieces before byte-pair merging, run
// through PCRE2 with JIT. tiktoken encodes each regex match on its own and drops any text
// the pattern does not match (none, for the patterns below).
//
// The patterns are the tiktoken ones rewritten in PCRE2 syntax, because two constructs do
// not carry over literally:
//  - `\s` in tiktoken (Rust regex) is the Unicode White_Space property. PCRE2's \s follows
//    the library version; we spell the class out (kWhiteSpace) so every PCRE2 agrees.
//  - Kimi's pattern uses class intersection `[...&&[^\p{Han}]]` (Rust syntax; PCRE2 10.42
//    has none) and Rust's `\p{Han}` is the Script property, whereas PCRE2's bare \p{Han}
//    is Script_Extensions (it would also match U+3001 "、"). We write `\p{sc=Han}` and
//    express "class minus Han" as a negative lookahead before the class.
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace moonrun::chat {

// Kimi (K2, Kimi Linear, K3): tokenization_kimi.py `pat_str`. Alternatives in order: Han
// runs; a letter run (optional leading non-letter, upper-case-ish then lower-case-ish,
// English contraction); the same with at least one upper-case-ish letter; 1-3 digits;
// punctuation runs with trailing newlines; whitespace ending in newlines; whitespace not
// followed by a non-space; any whitespace.
extern const std::string kKimiPattern;
// tiktoken's public encodings (tiktoken_ext/openai_public.py), for agreement tests.
extern const std::string kCl100kPattern;
extern const std::string kO200kPattern;

class Pretokenizer {
 public:
  // Compiles with PCRE2_UTF | PCRE2_UCP and JIT. Error names the pattern offset.
  static Result<Pretokenizer> compile(std::string_view pattern);

  // Matching state (PCRE2 match data, JIT stack), independent of the pattern. Not
  // shareable between threads; the Pretokenizer itself is. thread_scratch() is this
  // thread's, made once: creating one maps a JIT stack, too slow to do per call.
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class Pretokenizer;
    pcre2_real_match_data_8* match_data_ = nullptr;
    pcre2_real_match_context_8* match_context_ = nullptr;
    pcre2_real_jit_stack_8* jit_stack_ = nullptr;
  };

  // Calls on_piece(std::string_view) for each match, left to right. `text` must be valid
  // UTF-8 (the tokenizer separates ill-formed bytes first); it is not re-checked.
  template <typename Fn>
  void split(std::string_view text, Scratch& scratch, Fn&& on_piece) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t begin = 0, end = 0;
      if (!next_match(text, pos, scratch, &begin, &end)) break;
      on_piece(text.substr(begin, end - begin));
      pos = end > begin ? end : next_char_end(text, begin);  // empty match: step one char
    }
  }

  static Scratch& thread_scratch();

  const std::string& pattern() const { return pattern_; }

 private:
  bool next_match(std::string_view text, size_t start, Scratch& scratch, size_t* begin, size_t* end) const;
  static size_t next_char_end(std::string_view text, size_t pos);

  std::string pattern_;
  std::shared_ptr<pcre2_real_code_8> code_;
  bool jit_ = false;
};

}  // namespace moonrun::chat
