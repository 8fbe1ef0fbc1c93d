#include "chat/tokenizer_ranks.h"

#include <array>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>

namespace moonrun::chat {

namespace {

constexpr char kBase64Alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// A multiply-xorshift hash over 8-byte words: token strings are short (a few bytes), so a
// cheap hash with good low bits matters more than throughput on long keys.
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    if (n >= 4) {
      uint32_t a, b;
      std::memcpy(&a, p, 4);
      std::memcpy(&b, p + n - 4, 4);  // overlapping read covers 4..7 bytes
      w = (uint64_t(a) << 32) | b;
    } else {
      w = uint64_t(uint8_t(p[0])) | (uint64_t(uint8_t(p[n / 2])) << 8) | (uint64_t(uint8_t(p[n - 1])) << 16);
    }
    h = (h ^ w) * 0x94D049BB133111EBull;
  }
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

// Equality of two n-byte strings with in-bounds word loads (overlapping at the tail):
// token strings are short, and a libc memcmp call costs more than the comparison.
inline bool equal_bytes(const char* a, const char* b, size_t n) {
  if (n >= 8) {
    for (size_t i = 0; i + 8 <= n; i += 8) {
      uint64_t x, y;
      std::memcpy(&x, a + i, 8);
      std::memcpy(&y, b + i, 8);
      if (x != y) return false;
    }
    uint64_t x, y;
    std::memcpy(&x, a + n - 8, 8);
    std::memcpy(&y, b + n - 8, 8);
    return x == y;
  }
  if (n >= 4) {
    uint32_t x0, y0, x1, y1;
    std::memcpy(&x0, a, 4);
    std::memcpy(&y0, b, 4);
    std::memcpy(&x1, a + n - 4, 4);
    std::memcpy(&y1, b + n - 4, 4);
    return x0 == y0 && x1 == y1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kBase64Alphabet[v >> 18];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += kBase64Alphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (rest == 2) v |= uint8_t(bytes[i + 1]) << 8;
    out += kBase64Alphabet[v >> 18];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += rest == 2 ? kBase64Alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view text, std::string* out) {
  static const auto table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[uint8_t(kBase64Alphabet[i])] = int8_t(i);
    return t;
  }();
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return false;
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = table[uint8_t(c)];
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  return true;
}

Result<RankTable> RankTable::parse(std::string_view text, const std::string& source) {
  RankTable table;
  size_t line_no = 0;
  std::string bytes;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    if (line.empty()) continue;  // tiktoken's loader skips blank lines
    const size_t space = line.find(' ');
    const std::string where = source + ":" + std::to_string(line_no);
    if (space == std::string_view::npos) return data_loss(where + ": expected `base64 rank`");
    if (!base64_decode(line.substr(0, space), &bytes) || bytes.empty()) {
      return data_loss(where + ": token is not valid non-empty base64");
    }
    std::string_view rank_text = line.substr(space + 1);
    uint64_t rank = 0;
    if (rank_text.empty() || rank_text.size() > 10) return data_loss(where + ": rank is not an integer");
    for (char c : rank_text) {
      if (c < '0' || c > '9') return data_loss(where + ": rank is not an integer");
      rank = rank * 10 + uint64_t(c - '0');
    }
    if (rank >= (1u << 31)) return data_loss(where + ": rank " + std::string(rank_text) + " is too large");
    MR_RETURN_IF_ERROR(table.insert(bytes, uint32_t(rank), source, line_no));
  }
  MR_RETURN_IF_ERROR(table.finish(source));
  return table;
}

Result<RankTable> RankTable::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path.string() + ": cannot open the tiktoken ranks file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parse(buffer.str(), path.string());
}

Result<RankTable> RankTable::from_tokens(std::vector<std::string> tokens) {
  RankTable table;
  for (size_t r = 0; r < tokens.size(); ++r) {
    if (tokens[r].empty()) return invalid_argument("ranks: token " + std::to_string(r) + " is empty");
    MR_RETURN_IF_ERROR(table.insert(tokens[r], uint32_t(r), "ranks", r + 1));
  }
  MR_RETURN_IF_ERROR(table.finish("ranks"));
  return table;
}

Status RankTable::insert(std::string_view bytes, uint32_t rank, const std::string& source, size_t line) {
  if (arena_.size() + bytes.size() >= UINT32_MAX) return data_loss(source + ": too many token bytes");
  entries_.push_back({uint32_t(arena_.size()), uint32_t(bytes.size()), rank});
  arena_.append(bytes);
  return Status::ok();
}

Status RankTable::finish(const std::string& source) {
  if (entries_.empty()) return data_loss(source + ": no tokens");
  uint32_t max_rank = 0;
  for (const Entry& e : entries_) max_rank = std::max(max_rank, e.rank);
  by_rank_.assign(size_t(max_rank) + 1, kNoEntry);
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    uint32_t& slot = by_rank_[entries_[i].rank];
    if (slot != kNoEntry) return data_loss(source + ": rank " + std::to_string(entries_[i].rank) + " appears twice");
    slot = i;
  }
  size_t capacity = 16;
  while (capacity < entries_.size() * 2) capacity <<= 1;
  slots_.assign(capacity, Slot{0, 0, 0, kNoRank});
  slot_mask_ = capacity - 1;
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const std::string_view key(arena_.data() + e.offset, e.length);
    const uint64_t h = hash_bytes(key.data(), key.size());
    const uint32_t tag = uint32_t(h >> 32);
    for (uint64_t s = h & slot_mask_;; s = (s + 1) & slot_mask_) {
      Slot& slot = slots_[s];
      if (slot.length == 0) {
        slot = Slot{tag, e.offset, e.length, e.rank};
        break;
      }
      if (slot.tag == tag && slot.length == e.length &&
          std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0) {
        return data_loss(source + ": token of rank " + std::to_string(e.rank) + " repeats the token of rank " +
                         std::to_string(slot.rank));
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    if (rank(std::string_view(&c, 1)) == kNoRank) {
      return data_loss(source + ": the single byte 0x" + "0123456789abcdef"[b >> 4] + "0123456789abcdef"[b & 15] +
                       " has no rank (every byte needs one)");
    }
    byte_rank_[b] = rank(std::string_view(&c, 1));
  }
  return Status::ok();
}

uint32_t RankTable::rank(std::string_view bytes) const {
  const uint64_t h = hash_bytes(bytes.data(), bytes.size());
  const uint32_t tag = uint32_t(h >> 32);
  for (uint64_t s = h & slot_mask_;; s = (s + 1) & slot_mask_) {
    const Slot& slot = slots_[s];
    if (slot.length == 0) return kNoRank;
    if (slot.tag == tag && slot.length == bytes.size() &&
        equal_bytes(arena_.data() + slot.offset, bytes.data(), bytes.size())) {
      return slot.rank;
    }
  }
}

std::string_view RankTable::bytes(uint32_t rank) const {
  if (rank >= by_rank_.size() || by_rank_[rank] == kNoEntry) return {};
  const Entry& e = entries_[by_rank_[rank]];
  return std::string_view(arena_.data() + e.offset, e.length);
}

void RankTable::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  // Most pieces are whole tokens: one lookup.
  const uint32_t whole = rank(piece);
  if (whole != kNoRank) {
    out.push_back(whole);
    return;
  }
  // tiktoken's quadratic scan is the fastest for short pieces; long ones (runs of
  // letters, digits-free symbol soups) use a heap so the cost stays O(n log n).
  if (piece.size() <= 96) {
    merge_small(piece, out);
  } else {
    merge_large(piece, out);
  }
}

// tiktoken's _byte_pair_merge: parts[i].rank is the rank of part i joined with part i+1.
void RankTable::merge_small(std::string_view piece, std::vector<uint32_t>& out) const {
  struct Part {
    uint32_t start;
    uint32_t rank;   // of this part joined with the next
    uint32_t token;  // this part's own rank (so no lookups at the end)
  };
  Part parts[98];
  const uint32_t n = uint32_t(piece.size());
  for (uint32_t i = 0; i + 1 < n; ++i) parts[i] = {i, rank(piece.substr(i, 2)), byte_rank_[uint8_t(piece[i])]};
  parts[n - 1] = {n - 1, kNoRank, byte_rank_[uint8_t(piece[n - 1])]};
  parts[n] = {n, kNoRank, kNoRank};
  size_t count = n + 1;
  // Rank of the pair that would start at part i once part i+1 is merged into it.
  auto joined_rank = [&](size_t i) {
    if (i + 3 >= count) return kNoRank;
    return rank(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
  };
  for (;;) {
    uint32_t min_rank = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (parts[i].rank < min_rank) {  // strict: ties go to the leftmost pair
        min_rank = parts[i].rank;
        at = i;
      }
    }
    if (min_rank == kNoRank) break;
    parts[at].token = min_rank;
    if (at > 0) parts[at - 1].rank = joined_rank(at - 1);
    parts[at].rank = joined_rank(at);
    std::memmove(&parts[at + 1], &parts[at + 2], (count - at - 2) * sizeof(Part));
    --count;
  }
  for (size_t i = 0; i + 1 < count; ++i) out.push_back(parts[i].token);
}

// The same merge order with a min-heap of (rank, start): the minimum (rank, start) over
// the live pairs is exactly tiktoken's "lowest rank, leftmost" choice, because a part's
// start never moves. Stale heap entries are recognised by a changed pair rank (a pair at
// a given start only grows, so its rank cannot come back).
void RankTable::merge_large(std::string_view piece, std::vector<uint32_t>& out) const {
  const uint32_t n = uint32_t(piece.size());
  std::vector<uint32_t> next(n + 1), prev(n + 1), pair_rank(n + 1, kNoRank);  // [n + 1] nodes
  using Item = std::pair<uint32_t, uint32_t>;                              // (rank, start)
  std::vector<Item> heap_storage;
  heap_storage.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? kNoRank : i - 1;
    if (i + 1 < n) {
      pair_rank[i] = rank(piece.substr(i, 2));
      if (pair_rank[i] != kNoRank) heap_storage.push_back({pair_rank[i], i});
    }
  }
  next[n] = n;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap(std::greater<Item>(), std::move(heap_storage));
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    if (pair_rank[i] != r) continue;  // stale
    const uint32_t j = next[i], k = next[j];
    next[i] = k;
    if (k < n) prev[k] = i;
    pair_rank[j] = kNoRank;  // j is gone
    pair_rank[i] = k < n ? rank(piece.substr(i, next[k] - i)) : kNoRank;
    if (pair_rank[i] != kNoRank) heap.push({pair_rank[i], i});
    if (prev[i] != kNoRank) {
      const uint32_t p = prev[i];
      pair_rank[p] = rank(piece.substr(p, k - p));
      if (pair_rank[p] != kNoRank) heap.push({pair_rank[p], p});
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) out.push_back(rank(piece.substr(i, next[i] - i)));
}

}  // namespace moonrun::chat
