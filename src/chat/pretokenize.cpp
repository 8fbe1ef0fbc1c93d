#include "chat/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "chat/tokenizer_utf8.h"

namespace moonrun::chat {

namespace {

// Unicode White_Space (what Rust regex's \s means): TAB..CR, SPACE, NEL, NBSP, OGHAM SPACE
// MARK, EN QUAD..HAIR SPACE, LINE/PARAGRAPH SEPARATOR, NNBSP, MMSP, IDEOGRAPHIC SPACE.
#define WS R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})"
// Kimi's letter classes minus Script=Han (see the header for why a lookahead).
#define UPPERISH R"((?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))"
#define LOWERISH R"((?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))"
#define CONTRACTION R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"

}  // namespace

const std::string kKimiPattern =
    R"(\p{sc=Han}+)"
    R"(|[^\r\n\p{L}\p{N}]?)" UPPERISH "*" LOWERISH "+" CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?)" UPPERISH "+" LOWERISH "*" CONTRACTION
    R"(|\p{N}{1,3})"
    R"(| ?[^)" WS R"(\p{L}\p{N}]+[\r\n]*)"
    R"(|[)" WS R"(]*[\r\n]+)"
    R"(|[)" WS R"(]+(?![^)" WS R"(]))"
    R"(|[)" WS R"(]+)";

// cl100k_base: `$` in Rust regex is end of text, which PCRE2 spells \z.
const std::string kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+)"
    R"(| ?[^)" WS R"(\p{L}\p{N}]++[\r\n]*+)"
    R"(|[)" WS R"(]++\z)"
    R"(|[)" WS R"(]*[\r\n])"
    R"(|[)" WS R"(]+(?![^)" WS R"(]))"
    R"(|[)" WS R"(])";

const std::string kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)" CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)" CONTRACTION
    R"(|\p{N}{1,3})"
    R"(| ?[^)" WS R"(\p{L}\p{N}]+[\r\n/]*)"
    R"(|[)" WS R"(]*[\r\n]+)"
    R"(|[)" WS R"(]+(?![^)" WS R"(]))"
    R"(|[)" WS R"(]+)";

#undef WS
#undef UPPERISH
#undef LOWERISH
#undef CONTRACTION

Result<Pretokenizer> Pretokenizer::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return invalid_argument("pre-tokenisation pattern: " + std::string(reinterpret_cast<char*>(message)) +
                            " at offset " + std::to_string(error_offset));
  }
  Pretokenizer pre;
  pre.pattern_ = std::string(pattern);
  pre.code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  // JIT is an optimisation: when the platform has none we fall back to the interpreter.
  pre.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return pre;
}

Pretokenizer::Scratch::Scratch()
    // One ovector pair: only the whole match is read (captures beyond it are dropped).
    : match_data_(pcre2_match_data_create(1, nullptr)),
      match_context_(pcre2_match_context_create(nullptr)),
      // Kimi's letter alternatives repeat a group ((?!Han)[class])*, and JIT backtracking
      // keeps a frame per iteration: a 25,000-letter run needs about a megabyte, more than
      // PCRE2's 32 KiB default. The stack is mapped lazily up to its maximum.
      jit_stack_(pcre2_jit_stack_create(64 << 10, 64 << 20, nullptr)) {
  MR_CHECK(match_data_ && match_context_ && jit_stack_) << "out of memory allocating PCRE2 match state";
  pcre2_jit_stack_assign(match_context_, nullptr, jit_stack_);
}

Pretokenizer::Scratch& Pretokenizer::thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

Pretokenizer::Scratch::~Scratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(match_context_);
  pcre2_match_data_free(match_data_);
}

bool Pretokenizer::next_match(std::string_view text, size_t start, Scratch& scratch, size_t* begin,
                              size_t* end) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The tokenizer validated the UTF-8 already; NO_UTF_CHECK avoids rescanning the whole
  // subject on every call (which would make splitting quadratic).
  int rc = jit_ ? pcre2_jit_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                  scratch.match_data_, scratch.match_context_)
                : pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                              scratch.match_data_, scratch.match_context_);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // Only a pathological run (far beyond the 25,000-character split) gets here: the
    // interpreter keeps its backtracking frames on the heap instead.
    rc = pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                     scratch.match_data_, scratch.match_context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;  // tiktoken drops unmatched text
  // rc == 0: the match has more captures than the one ovector pair; [0] and [1] are set.
  if (rc < 0) {
    // A resource limit even so: never lose text, take the next character as its own piece.
    *begin = start;
    *end = next_char_end(text, start);
    return true;
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data_);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

size_t Pretokenizer::next_char_end(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t len = utf8_sequence_length(p, text.size() - pos);
  return pos + (len ? len : 1);
}

}  // namespace moonrun::chat
