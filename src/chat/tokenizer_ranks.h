#pragma once
// The mergeable ranks of a tiktoken encoding (`tiktoken.model`: one `base64(bytes) rank`
// line per token) and byte-pair encoding of one pre-tokenised piece with them.
//
// BPE here is tiktoken's definition, not a merge list: a piece starts as single bytes;
// repeatedly, among adjacent part pairs whose concatenated bytes are a token, the one with
// the lowest rank merges (ties: leftmost); stop when no pair is a token. Each final part is
// one token. A rank is a byte string's priority and id at once.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace moonrun::chat {

inline constexpr uint32_t kNoRank = UINT32_MAX;

std::string base64_encode(std::string_view bytes);
// Standard alphabet, '=' padding optional; false on any other character.
bool base64_decode(std::string_view text, std::string* out);

class RankTable {
 public:
  RankTable() = default;

  // Parses tiktoken.model text. `source` names the file in error messages. Requires unique
  // ranks, unique byte strings, and every single byte present (so any input encodes).
  static Result<RankTable> parse(std::string_view text, const std::string& source);
  static Result<RankTable> load(const std::filesystem::path& path);
  // tokens[r] is the byte string of rank r (dense ranks 0..n-1). Same checks as parse().
  static Result<RankTable> from_tokens(std::vector<std::string> tokens);

  // Rank of the byte string, or kNoRank.
  uint32_t rank(std::string_view bytes) const;
  // Byte string of a rank; empty when the rank is not in the table.
  std::string_view bytes(uint32_t rank) const;
  // Number of tokens (tiktoken: len(mergeable_ranks); special tokens start here).
  size_t size() const { return entries_.size(); }
  // Largest rank + 1.
  uint32_t rank_end() const { return static_cast<uint32_t>(by_rank_.size()); }

  // Appends the token ids of one piece (BPE as above) to `out`.
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;

 private:
  struct Entry {
    uint32_t offset;  // into arena_
    uint32_t length;
    uint32_t rank;
  };
  // Everything a lookup needs in one 16-byte slot: one cache line, then the bytes.
  struct Slot {
    uint32_t tag;     // high bits of the hash
    uint32_t offset;  // into arena_
    uint32_t length;  // 0: free slot
    uint32_t rank;
  };
  static constexpr uint32_t kNoEntry = UINT32_MAX;

  Status insert(std::string_view bytes, uint32_t rank, const std::string& source, size_t line);
  Status finish(const std::string& source);
  void merge_small(std::string_view piece, std::vector<uint32_t>& out) const;
  void merge_large(std::string_view piece, std::vector<uint32_t>& out) const;

  std::string arena_;               // all token bytes, back to back
  std::vector<Entry> entries_;
  std::vector<uint32_t> by_rank_;   // [rank_end] -> entry index or kNoEntry
  std::vector<Slot> slots_;         // open addressing, power-of-two size, linear probing
  uint64_t slot_mask_ = 0;
  uint32_t byte_rank_[256] = {};
};

}  // namespace moonrun::chat
