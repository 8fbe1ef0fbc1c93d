#include "chat/bpe_train.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <queue>
#include <unordered_map>

#include "chat/pretokenize.h"
#include "chat/tokenizer_ranks.h"
#include "chat/tokenizer_utf8.h"

namespace moonrun::chat {

namespace {

using PairKey = uint64_t;  // (left rank << 32) | right rank
inline PairKey pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

struct Word {
  std::vector<uint32_t> tokens;
  int64_t count = 0;
  size_t last_merge = SIZE_MAX;  // merge step that last rewrote this word (dedups work lists)
};

}  // namespace

Result<std::vector<std::string>> train_bpe_ranks(std::string_view corpus, size_t n_merges, std::string_view pattern) {
  auto pre = MR_TRY(Pretokenizer::compile(pattern));
  // Distinct pieces with counts. std::map: a deterministic word order.
  std::map<std::string, int64_t, std::less<>> piece_counts;
  {
    Pretokenizer::Scratch& scratch = Pretokenizer::thread_scratch();
    for_each_utf8_run(corpus, [&](std::string_view run, bool well_formed) {
      if (!well_formed) {
        ++piece_counts[std::string(run)];
        return;
      }
      pre.split(run, scratch, [&](std::string_view piece) { ++piece_counts[std::string(piece)]; });
    });
  }

  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[b] = std::string(1, char(b));
  std::unordered_map<std::string, uint32_t> token_ids;
  for (uint32_t b = 0; b < 256; ++b) token_ids.emplace(tokens[b], b);

  std::vector<Word> words;
  words.reserve(piece_counts.size());
  std::unordered_map<PairKey, int64_t> pair_counts;
  std::unordered_map<PairKey, std::vector<uint32_t>> pair_words;  // may list a word twice or stale
  for (const auto& [piece, count] : piece_counts) {
    Word w;
    w.count = count;
    for (unsigned char c : piece) w.tokens.push_back(c);
    const uint32_t index = uint32_t(words.size());
    for (size_t i = 0; i + 1 < w.tokens.size(); ++i) {
      const PairKey k = pair_key(w.tokens[i], w.tokens[i + 1]);
      pair_counts[k] += count;
      pair_words[k].push_back(index);
    }
    words.push_back(std::move(w));
  }

  // Max-heap on (count, smaller key first); entries go stale when a count changes and are
  // checked against pair_counts when popped.
  struct Item {
    int64_t count;
    PairKey key;
    bool operator<(const Item& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Item> heap;
  for (const auto& [k, c] : pair_counts) heap.push({c, k});

  size_t step = 0;
  while (tokens.size() < 256 + n_merges && !heap.empty()) {
    const Item top = heap.top();
    heap.pop();
    auto it = pair_counts.find(top.key);
    if (it == pair_counts.end() || it->second != top.count) continue;  // stale
    if (top.count < 2) break;
    const uint32_t left = uint32_t(top.key >> 32), right = uint32_t(top.key & 0xFFFFFFFFu);
    std::string merged = tokens[left] + tokens[right];
    // Two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"): reuse the token.
    uint32_t id;
    if (auto found = token_ids.find(merged); found != token_ids.end()) {
      id = found->second;
    } else {
      id = uint32_t(tokens.size());
      token_ids.emplace(merged, id);
      tokens.push_back(std::move(merged));
    }
    ++step;
    std::vector<PairKey> touched;
    std::vector<uint32_t> word_list = std::move(pair_words[top.key]);
    pair_words.erase(top.key);
    for (uint32_t wi : word_list) {
      Word& w = words[wi];
      if (w.last_merge == step) continue;
      w.last_merge = step;
      bool present = false;
      for (size_t i = 0; i + 1 < w.tokens.size(); ++i) {
        if (w.tokens[i] == left && w.tokens[i + 1] == right) {
          present = true;
          break;
        }
      }
      if (!present) continue;
      for (size_t i = 0; i + 1 < w.tokens.size(); ++i) {
        const PairKey k = pair_key(w.tokens[i], w.tokens[i + 1]);
        pair_counts[k] -= w.count;
        touched.push_back(k);
      }
      std::vector<uint32_t> rewritten;
      rewritten.reserve(w.tokens.size());
      for (size_t i = 0; i < w.tokens.size(); ++i) {
        if (i + 1 < w.tokens.size() && w.tokens[i] == left && w.tokens[i + 1] == right) {
          rewritten.push_back(id);
          ++i;
        } else {
          rewritten.push_back(w.tokens[i]);
        }
      }
      w.tokens = std::move(rewritten);
      for (size_t i = 0; i + 1 < w.tokens.size(); ++i) {
        const PairKey k = pair_key(w.tokens[i], w.tokens[i + 1]);
        pair_counts[k] += w.count;
        touched.push_back(k);
        if (w.tokens[i] == id || w.tokens[i + 1] == id) pair_words[k].push_back(wi);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (PairKey k : touched) {
      auto c = pair_counts.find(k);
      if (c->second <= 0) {
        pair_counts.erase(c);
      } else {
        heap.push({c->second, k});
      }
    }
  }
  return tokens;
}

Status write_tiktoken_model(const std::filesystem::path& path, const std::vector<std::string>& tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found(path.string() + ": cannot create the tiktoken ranks file");
  std::string text;
  for (size_t r = 0; r < tokens.size(); ++r) {
    text += base64_encode(tokens[r]);
    text += ' ';
    text += std::to_string(r);
    text += '\n';
  }
  out << text;
  out.close();
  if (!out) return data_loss(path.string() + ": write failed");
  return Status::ok();
}

}  // namespace moonrun::chat
