#pragma once
// A small deterministic byte-level BPE trainer, for the embedded demo model and for test
// vocabularies (we cannot ship Kimi's 163,584-rank file). Output is in tiktoken's form:
// ranks 0..255 are the single bytes, then one rank per merge in the order learned.
//
// Training: the corpus is pre-tokenised with `pattern`; each distinct piece is a word,
// weighted by its count. Repeatedly the most frequent adjacent token pair merges into a new
// token (ties: the pair with the smaller (left rank, right rank)). Pairs are counted within
// pieces only, as tiktoken never merges across a piece boundary. Training stops after
// `n_merges` new tokens or when no pair occurs at least twice.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace moonrun::chat {

// tokens[r] = bytes of rank r; size is 256 + the number of merges learned.
Result<std::vector<std::string>> train_bpe_ranks(std::string_view corpus, size_t n_merges, std::string_view pattern);

// Writes `base64(bytes) rank` lines (tiktoken.model).
Status write_tiktoken_model(const std::filesystem::path& path, const std::vector<std::string>& tokens);

// A few KB of English prose, chat and code written for moonrun, to train the demo vocab.
std::string_view builtin_bpe_corpus();

}  // namespace moonrun::chat
