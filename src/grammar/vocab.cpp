#include "grammar/vocab.h"

#include <algorithm>
#include <numeric>

#include "common/check.h"

namespace moonrun::grammar {

TokenVocab::TokenVocab(std::vector<std::string> token_bytes, std::vector<bool> special, std::vector<int32_t> eos)
    : bytes_(std::move(token_bytes)), special_(std::move(special)), eos_(std::move(eos)) {
  MR_CHECK(bytes_.size() == special_.size()) << bytes_.size() << " token byte strings, " << special_.size() << " flags";
  // Sort the ordinary tokens by bytes; the trie is then built breadth-first so that each
  // node's children are contiguous (the walk reads them as one span).
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (!special_[id] && !bytes_[id].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  for (int32_t id : order) max_bytes_ = std::max(max_bytes_, bytes_[id].size());

  // A node is the range [lo, hi) of sorted tokens sharing a prefix of length depth.
  struct Pending {
    size_t lo, hi, depth;
    uint32_t node;
  };
  trie_.push_back(TrieNode{});
  std::vector<Pending> level{{0, order.size(), 0, 0}};
  while (!level.empty()) {
    std::vector<Pending> next;
    for (const Pending& p : level) {
      size_t i = p.lo;
      // The token equal to the prefix itself sorts first in the range.
      if (i < p.hi && bytes_[order[i]].size() == p.depth) {
        trie_[p.node].token = order[i];  // duplicates (same bytes): the first id wins
        while (i < p.hi && bytes_[order[i]].size() == p.depth) ++i;
      }
      trie_[p.node].first_child = static_cast<uint32_t>(trie_.size());
      while (i < p.hi) {
        const auto b = static_cast<uint8_t>(bytes_[order[i]][p.depth]);
        size_t j = i;
        while (j < p.hi && static_cast<uint8_t>(bytes_[order[j]][p.depth]) == b) ++j;
        TrieNode child;
        child.byte = b;
        trie_.push_back(child);
        next.push_back({i, j, p.depth + 1, static_cast<uint32_t>(trie_.size() - 1)});
        ++trie_[p.node].n_children;
        i = j;
      }
    }
    level = std::move(next);
  }
}

}  // namespace moonrun::grammar
