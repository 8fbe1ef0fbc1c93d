#pragma once
// The Kimi tokenizer: tiktoken byte-level BPE (tokenizer_ranks.h) over PCRE2
// pre-tokenisation (pretokenize.h), 256 reserved special tokens after the base ranks, and
// the input splitting of tokenization_kimi.py.
//
// encode(text) of the reference, for one segment:
//   1. cut the text into chunks of 400,000 characters (code points);
//   2. cut each chunk wherever a run of consecutive whitespace (Python str.isspace) or of
//      consecutive non-whitespace characters would exceed 25,000: a new piece starts at
//      the 25,001st character of the run;
//   3. tiktoken-encode each piece; special tokens are recognised only when the segment
//      allows them (structural markers), otherwise `<|open|>` in user text is plain text.
// Step 3 (tiktoken): find the leftmost special token, encode the ordinary text before it
// (pattern matches, each byte-pair encoded), emit the special id, continue after it.
//
// Ill-formed UTF-8 (which a Python str cannot hold) is defined here byte-wise: for
// splitting, each ill-formed byte counts as one non-space character; each maximal run of
// ill-formed bytes is byte-pair encoded as one piece; the well-formed text on each side is
// encoded as tiktoken encodes it alone. decode() gives the bytes back exactly.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/pretokenize.h"
#include "chat/tokenizer_ranks.h"
#include "common/status.h"

namespace moonrun::chat {

// Text to encode, and whether special-token names in it become special tokens (true only
// for the markers the chat renderer itself writes).
struct Segment {
  std::string text;
  bool allow_special = false;
};

struct SpecialToken {
  std::string name;
  uint32_t id;
};

struct TokenizerOptions {
  std::string pattern = kKimiPattern;
  size_t max_run_chars = 25'000;  // step 2 above; 0 = off (plain tiktoken)
  size_t chunk_chars = 400'000;   // step 1 above; 0 = off (plain tiktoken)
};

// tokenization_kimi.py reserves this many special ids right after the base ranks.
inline constexpr uint32_t kNumReservedSpecialTokens = 256;

// The K3 names (K3_SPEC §4) as offsets from the first special id; every other reserved slot
// is `<|reserved_token_ID|>` with its absolute id. Used when a checkpoint has no
// tokenizer_config.json.
std::vector<SpecialToken> kimi_k3_default_special_tokens(uint32_t num_base_tokens);

class Tokenizer {
 public:
  // From a checkpoint directory: tiktoken.model, and tokenizer_config.json's
  // added_tokens_decoder when the file exists (K3 defaults otherwise).
  static Result<Tokenizer> load(const std::filesystem::path& checkpoint_dir, TokenizerOptions options = {});
  // From a ranks file and an optional tokenizer_config.json (empty path: K3 defaults).
  static Result<Tokenizer> load_files(const std::filesystem::path& tiktoken_model,
                                      const std::filesystem::path& tokenizer_config, TokenizerOptions options = {});
  // Names for the reserved ids from tokenizer_config.json text, as tokenization_kimi.py
  // builds them: added_tokens_decoder[id].content where given, `<|reserved_token_ID|>`
  // otherwise; ids outside [num_base, num_base + 256) are ignored, as the reference does.
  static Result<std::vector<SpecialToken>> special_tokens_from_config(std::string_view config_json,
                                                                     uint32_t num_base_tokens,
                                                                     const std::string& source);
  static Result<Tokenizer> create(RankTable ranks, std::vector<SpecialToken> specials, TokenizerOptions options = {});

  std::vector<uint32_t> encode(std::string_view text, bool allow_special) const;
  std::vector<uint32_t> encode(std::span<const Segment> segments) const;
  // Appends to `out` (one piece of a larger prompt).
  void encode_append(std::string_view text, bool allow_special, std::vector<uint32_t>& out) const;

  // Concatenated token bytes (special tokens as their names); unknown ids are skipped.
  std::string decode(std::span<const uint32_t> ids) const;
  // decode() with ill-formed UTF-8 replaced by U+FFFD per maximal subpart, as
  // tiktoken's decode (errors="replace") does.
  std::string decode_text(std::span<const uint32_t> ids) const;
  // Bytes of one token (a special token's name); empty for an unknown id.
  std::string_view token_bytes(uint32_t id) const;

  std::optional<uint32_t> special_id(std::string_view name) const;
  bool is_special(uint32_t id) const {
    // Special ids may have gaps (cl100k_base: 100257..100260, 100276): a gap is no token.
    return id >= special_begin_ && id - special_begin_ < special_names_.size() &&
           !special_names_[id - special_begin_].empty();
  }
  bool is_valid_id(uint32_t id) const { return is_special(id) || !ranks_.bytes(id).empty(); }
  // tiktoken n_vocab: largest id + 1.
  uint32_t vocab_size() const { return special_begin_ + uint32_t(special_names_.size()); }
  uint32_t num_base_tokens() const { return special_begin_; }
  const RankTable& ranks() const { return ranks_; }
  const TokenizerOptions& options() const { return options_; }

 private:
  struct SpecialMatch {
    size_t pos = std::string_view::npos;
    size_t length = 0;
    uint32_t id = 0;
  };
  // Leftmost special token at or after `from`; the longest one when several start there.
  SpecialMatch find_special(std::string_view text, size_t from) const;
  void encode_run(std::string_view piece, bool allow_special, Pretokenizer::Scratch& scratch,
                  std::vector<uint32_t>& out) const;
  void encode_ordinary(std::string_view text, Pretokenizer::Scratch& scratch, std::vector<uint32_t>& out) const;

  RankTable ranks_;
  Pretokenizer pre_;
  TokenizerOptions options_;
  uint32_t special_begin_ = 0;
  std::vector<std::string> special_names_;                    // [id - special_begin_]
  std::unordered_map<std::string, uint32_t> special_ids_;     // name -> id
  std::vector<std::vector<uint32_t>> specials_by_first_byte_;  // [256] -> ids, longest name first
};

}  // namespace moonrun::chat
