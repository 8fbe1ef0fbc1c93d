// libFuzzer target: the tokenizer, the streaming detokenizer and the file parsers must never
// crash, and must keep their invariants on any bytes:
//   decode(encode(x)) == x (with and without special tokens, with tiny split limits);
//   streamed detokenizer output == U+FFFD-replaced decode, each step well-formed UTF-8;
//   tiktoken.model / tokenizer_config.json parsing returns a Status, never aborts.
// The first input byte picks the mode; the rest is the payload.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "chat/bpe_train.h"
#include "chat/detokenizer.h"
#include "chat/tokenizer.h"
#include "chat/tokenizer_utf8.h"

using namespace moonrun::chat;

namespace {

std::unique_ptr<Tokenizer> make_tokenizer(size_t max_run_chars, size_t chunk_chars) {
  auto tokens = train_bpe_ranks(builtin_bpe_corpus(), 300, kKimiPattern);
  if (!tokens.is_ok()) std::abort();
  auto ranks = RankTable::from_tokens(*tokens);
  if (!ranks.is_ok()) std::abort();
  const uint32_t base = uint32_t(ranks->size());
  TokenizerOptions options;
  options.max_run_chars = max_run_chars;
  options.chunk_chars = chunk_chars;
  auto t = Tokenizer::create(std::move(ranks).value(), kimi_k3_default_special_tokens(base), options);
  if (!t.is_ok()) std::abort();
  return std::make_unique<Tokenizer>(std::move(t).value());
}

bool well_formed(std::string_view s) { return utf8_replace_invalid(s) == s; }

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> kimi = make_tokenizer(25'000, 400'000);
  static const std::unique_ptr<Tokenizer> tiny_runs = make_tokenizer(3, 11);  // splitting everywhere
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 5;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 0:
    case 1: {
      const Tokenizer& tok = mode == 0 ? *kimi : *tiny_runs;
      for (bool allow : {false, true}) {
        const auto ids = tok.encode(text, allow);
        check(tok.decode(ids) == text);
        for (uint32_t id : ids) check(tok.is_valid_id(id));
        if (!allow) {
          for (uint32_t id : ids) check(!tok.is_special(id));
        }
      }
      break;
    }
    case 2: {
      // Arbitrary ids (2 bytes each), streamed.
      Detokenizer d(*kimi, /*skip_special=*/data[0] & 8);
      std::string streamed;
      std::vector<uint32_t> ids;
      for (size_t i = 0; i + 1 < text.size(); i += 2) {
        const uint32_t id = (uint8_t(text[i]) | (uint8_t(text[i + 1]) << 8)) % (kimi->vocab_size() + 5);
        const std::string piece = d.push(id);
        check(well_formed(piece));
        streamed += piece;
        if (!((data[0] & 8) && kimi->is_special(id))) ids.push_back(id);
      }
      streamed += d.flush();
      check(streamed == kimi->decode_text(ids));
      break;
    }
    case 3: {
      auto ranks = RankTable::parse(text, "fuzz.model");
      if (ranks.is_ok()) {
        std::vector<uint32_t> out;
        ranks->encode_piece("hello world", out);
      }
      break;
    }
    case 4: {
      auto specials = Tokenizer::special_tokens_from_config(text, 1000, "fuzz_config.json");
      (void)specials;
      break;
    }
  }
  return 0;
}
