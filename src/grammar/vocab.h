#pragma once
// The tokenizer's vocabulary as the token masks need it: each ordinary token's bytes, in
// a byte trie (so one walk from a grammar state visits every token sharing a prefix once),
// and which ids are special tokens (one symbol each, never spelled out in bytes).
// Built once per tokenizer and shared by every grammar.
#include <cstdint>
#include <string>
#include <vector>

namespace moonrun::grammar {

class TokenVocab {
 public:
  // token_bytes[id]: the bytes of token id (ignored for special ids); special[id]: whether
  // id is a special token. eos: the ids that end a generation.
  TokenVocab(std::vector<std::string> token_bytes, std::vector<bool> special, std::vector<int32_t> eos);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool is_special(int32_t id) const { return special_[id]; }
  const std::vector<int32_t>& eos() const { return eos_; }
  size_t max_token_bytes() const { return max_bytes_; }

  // Trie over the ordinary tokens' bytes. Node 0 is the root (the empty prefix).
  struct TrieNode {
    uint32_t first_child = 0;  // children are contiguous: [first_child, first_child + n_children)
    uint16_t n_children = 0;
    uint8_t byte = 0;          // the byte leading here from the parent
    int32_t token = -1;        // the token whose bytes end here, if any
  };
  const std::vector<TrieNode>& trie() const { return trie_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<int32_t> eos_;
  std::vector<TrieNode> trie_;
  size_t max_bytes_ = 0;
};

}  // namespace moonrun::grammar
