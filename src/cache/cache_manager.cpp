#include "cache/cache_manager.h"

#include <algorithm>
#include <climits>
#include <string>

#include "common/check.h"

namespace moonrun {

Result<CacheConfig> size_cache_from_budget(const CacheLayout& layout, int64_t budget_bytes, int page_size_tokens,
                                           int num_state_slots, int num_snapshot_slots, int64_t max_total_tokens,
                                           int num_verify_slots) {
  if (page_size_tokens < 1)
    return invalid_argument("cache: page size must be >= 1 token, got " + std::to_string(page_size_tokens));
  if (num_state_slots < 1)
    return invalid_argument("cache: need >= 1 state slot (max running requests), got " +
                            std::to_string(num_state_slots));
  CacheConfig config;
  config.layout = layout;
  config.page_size_tokens = page_size_tokens;
  config.num_state_slots = num_state_slots;
  config.num_snapshot_slots = std::max(0, num_snapshot_slots);
  config.num_verify_slots = num_verify_slots > 0 ? num_state_slots : 0;
  const int64_t slots_bytes = config.state_bytes();
  const int64_t page_bytes = layout.kv_bytes_per_token * page_size_tokens;
  const int64_t left_bytes = budget_bytes - slots_bytes;
  int64_t num_pages = 0;
  if (page_bytes == 0) {
    if (max_total_tokens <= 0)
      return invalid_argument("cache: the model keeps no KV rows; give a max token count to size the pool");
    num_pages = (max_total_tokens + page_size_tokens - 1) / page_size_tokens;
    if (left_bytes < 0) num_pages = 0;
  } else {
    num_pages = left_bytes > 0 ? left_bytes / page_bytes : 0;
    if (max_total_tokens > 0)
      num_pages = std::min(num_pages, (max_total_tokens + page_size_tokens - 1) / page_size_tokens);
  }
  if (num_pages < 1) {
    return resource_exhausted("cache: memory budget " + std::to_string(budget_bytes) + " bytes cannot hold " +
                              std::to_string(config.total_slots()) + " state slots of " +
                              std::to_string(layout.state_bytes_per_slot) + " bytes plus one page of " +
                              std::to_string(page_bytes) +
                              " bytes; lower --max-running-requests or raise --mem-fraction-static");
  }
  config.num_pages = static_cast<int>(std::min<int64_t>(num_pages, INT32_MAX / 2));
  return config;
}

CacheManager::CacheManager(const CacheConfig& config)
    : config_(config), pages_(config.num_pages, std::max(config.page_groups, 1)) {
  MR_CHECK(config.page_size_tokens >= 1) << "page_size_tokens " << config.page_size_tokens;
  MR_CHECK(config.num_state_slots >= 0 && config.num_snapshot_slots >= 0) << "slot counts";
  if (config_.prefix_block_tokens > 0) {
    // Whole pages only: a shared page is never written by the sequence that shares it.
    const int ps = config_.page_size_tokens;
    config_.prefix_block_tokens = (config_.prefix_block_tokens + ps - 1) / ps * ps;
  }
  for (int s = config.num_state_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int s = config.total_slots() - 1; s >= config.num_state_slots; --s) free_snapshot_slots_.push_back(s);
}

namespace {
// The prefix key is a running hash of the tokens, finished with the length: the key of every
// block boundary of a prompt comes from one pass over it (a 1M-token prompt's 4,096
// boundaries hashed from the start each took 7 s of the engine's thread at admission).
constexpr uint64_t kKeySeed = 0x9e3779b97f4a7c15ull;
uint64_t key_step(uint64_t h, int32_t t) {
  h ^= static_cast<uint32_t>(t) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xbf58476d1ce4e5b9ull;
}
uint64_t key_finish(uint64_t h, size_t n) { return (h ^ n) * 0x94d049bb133111ebull; }
}  // namespace

uint64_t CacheManager::prefix_key(std::span<const int32_t> tokens) {
  uint64_t h = kKeySeed;
  for (int32_t t : tokens) h = key_step(h, t);
  return key_finish(h, tokens.size());
}

const CacheManager::PrefixEntry* CacheManager::find_prefix(std::span<const int32_t> tokens, uint64_t key) const {
  auto it = prefixes_.find(key);
  if (it == prefixes_.end()) return nullptr;
  const PrefixEntry& e = it->second;
  if (e.tokens.size() != tokens.size() || !std::equal(tokens.begin(), tokens.end(), e.tokens.begin())) return nullptr;
  return &e;
}

void CacheManager::touch(uint64_t key) {
  auto& e = prefixes_.at(key);
  lru_.splice(lru_.end(), lru_, e.lru);
}

bool CacheManager::evict_one() {
  if (lru_.empty()) return false;
  const uint64_t key = lru_.front();
  lru_.pop_front();
  auto it = prefixes_.find(key);
  MR_CHECK(it != prefixes_.end()) << "prefix LRU out of step";
  for (int32_t page : it->second.pages) pages_.release(page);
  free_snapshot_slots_.push_back(it->second.snapshot_slot);
  prefixes_.erase(it);
  return true;
}

bool CacheManager::take_slot(SeqEntry& entry) {
  if (entry.slot >= 0) return true;
  if (free_slots_.empty()) return false;
  entry.slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

int CacheManager::match_prefix(int64_t seq, std::span<const int32_t> tokens) {
  if (!prefix_caching() || has(seq) || free_slots_.empty()) return 0;
  const int B = config_.prefix_block_tokens;
  int best = 0;
  uint64_t best_key = 0;
  // The last token is always computed: its logits give the next token.
  uint64_t h = kKeySeed;
  for (int n = B; n <= static_cast<int>(tokens.size()) - 1; n += B) {
    for (int i = n - B; i < n; ++i) h = key_step(h, tokens[i]);
    const uint64_t key = key_finish(h, n);
    if (find_prefix(tokens.first(n), key)) best = n, best_key = key;
  }
  if (best == 0) return 0;
  const PrefixEntry& e = prefixes_.at(best_key);
  SeqEntry& entry = seqs_[seq];
  MR_CHECK(take_slot(entry)) << "a free slot was checked above";
  entry.pages = e.pages;
  for (int32_t page : entry.pages) pages_.add_ref(page);
  before_.push_back({e.snapshot_slot, entry.slot});
  touch(best_key);
  prefix_hit_tokens_ += best;
  return best;
}

int CacheManager::pages_needed(int64_t seq, int n_tokens) const {
  const int want = (n_tokens + config_.page_size_tokens - 1) / config_.page_size_tokens;
  auto it = seqs_.find(seq);
  const int have = it == seqs_.end() ? 0 : static_cast<int>(it->second.pages.size());
  return std::max(0, want - have);
}

bool CacheManager::allocate(int64_t seq, int n_tokens) {
  MR_CHECK(n_tokens >= 0) << "allocate(" << seq << ", " << n_tokens << ")";
  const bool fresh = !has(seq);
  if (fresh && free_slots_.empty()) return false;
  const int n_new_pages = pages_needed(seq, n_tokens);
  if (pages_.num_groups() > 1) return allocate_in_group(seq, n_new_pages);
  while (pages_.num_free() < n_new_pages && evict_one()) {
  }
  if (pages_.num_free() < n_new_pages) return false;
  SeqEntry& entry = seqs_[seq];
  if (entry.slot < 0) {
    MR_CHECK(take_slot(entry)) << "slot checked above";
    before_.push_back({-1, entry.slot});  // a recycled slot still holds its last owner's state
  }
  MR_CHECK(pages_.allocate(n_new_pages, entry.pages)) << "page pool changed under allocate";
  return true;
}

bool CacheManager::allocate_in_group(int64_t seq, int n_new_pages) {
  // Page groups (CacheConfig::page_groups): a sequence's pages come from its slot's group,
  // so a new one takes the most recently freed slot whose group has room.
  const int G = pages_.num_groups();
  auto it = seqs_.find(seq);
  int slot = it == seqs_.end() ? -1 : it->second.slot;
  size_t pick = free_slots_.size();
  if (slot < 0) {
    for (size_t i = free_slots_.size(); i-- > 0;)
      if (pages_.num_free(free_slots_[i] % G) >= n_new_pages) {
        pick = i;
        break;
      }
    if (pick == free_slots_.size()) return false;
    slot = free_slots_[pick];
  } else if (pages_.num_free(slot % G) < n_new_pages) {
    return false;
  }
  SeqEntry& entry = seqs_[seq];
  if (entry.slot < 0) {
    entry.slot = slot;
    free_slots_.erase(free_slots_.begin() + static_cast<std::ptrdiff_t>(pick));
    before_.push_back({-1, entry.slot});  // a recycled slot still holds its last owner's state
  }
  MR_CHECK(pages_.allocate(n_new_pages, entry.pages, entry.slot % G)) << "page group changed under allocate";
  return true;
}

void CacheManager::free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t page : it->second.pages) pages_.release(page);
  if (it->second.slot >= 0) free_slots_.push_back(it->second.slot);
  seqs_.erase(it);
}

int CacheManager::chunk_end(std::span<const int32_t> tokens, int from, int to) const {
  if (!prefix_caching()) return to;
  const int B = config_.prefix_block_tokens;
  const int boundary = std::min<int>(to, static_cast<int>(tokens.size())) / B * B;
  if (boundary <= from) return to;
  if (find_prefix(tokens.first(boundary), prefix_key(tokens.first(boundary)))) return to;
  return boundary;
}

bool CacheManager::plan_snapshot(int64_t seq, std::span<const int32_t> prefix) {
  const int n_tokens = static_cast<int>(prefix.size());
  if (!prefix_caching() || n_tokens <= 0 || n_tokens % config_.prefix_block_tokens != 0) return false;
  if (find_prefix(prefix, prefix_key(prefix))) return false;  // cached already
  for (const PendingSnapshot& p : pending_)
    if (p.seq == seq) return false;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.slot < 0) return false;
  if (free_snapshot_slots_.empty() && !evict_one()) return false;
  const int slot = free_snapshot_slots_.back();
  free_snapshot_slots_.pop_back();
  after_.push_back({it->second.slot, slot});
  pending_.push_back({seq, n_tokens, slot});
  return true;
}

std::vector<CacheManager::PendingSnapshot> CacheManager::take_planned_snapshots() {
  std::vector<PendingSnapshot> planned = std::move(pending_);
  pending_.clear();
  return planned;
}

void CacheManager::commit_snapshots(const std::function<std::span<const int32_t>(int64_t seq)>& tokens_of) {
  std::vector<PendingSnapshot> planned = std::move(pending_);
  pending_.clear();
  commit_snapshots(std::move(planned), tokens_of);
}

void CacheManager::commit_snapshots(std::vector<PendingSnapshot> planned,
                                    const std::function<std::span<const int32_t>(int64_t seq)>& tokens_of) {
  for (const PendingSnapshot& p : planned) {
    auto it = seqs_.find(p.seq);
    std::span<const int32_t> tokens;
    if (it != seqs_.end()) tokens = tokens_of(p.seq);
    const int n_pages = p.n_tokens / config_.page_size_tokens;
    if (it == seqs_.end() || static_cast<int>(tokens.size()) < p.n_tokens ||
        static_cast<int>(it->second.pages.size()) < n_pages) {
      free_snapshot_slots_.push_back(p.slot);
      continue;
    }
    const auto prefix = tokens.first(p.n_tokens);
    const uint64_t key = prefix_key(prefix);
    if (prefixes_.count(key)) {  // cached meanwhile (two sequences, one prefix), or a collision
      free_snapshot_slots_.push_back(p.slot);
      continue;
    }
    PrefixEntry e;
    e.tokens.assign(prefix.begin(), prefix.end());
    e.pages.assign(it->second.pages.begin(), it->second.pages.begin() + n_pages);
    for (int32_t page : e.pages) pages_.add_ref(page);
    e.snapshot_slot = p.slot;
    e.lru = lru_.insert(lru_.end(), key);
    prefixes_.emplace(key, std::move(e));
  }
}

void CacheManager::take_state_copies(std::vector<StateCopy>& before, std::vector<StateCopy>& after) {
  before = std::move(before_);
  after = std::move(after_);
  before_.clear();
  after_.clear();
}

const std::vector<int32_t>& CacheManager::page_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  MR_CHECK(it != seqs_.end()) << "no cache for sequence " << seq;
  return it->second.pages;
}

int CacheManager::state_slot(int64_t seq) const {
  auto it = seqs_.find(seq);
  MR_CHECK(it != seqs_.end()) << "no cache for sequence " << seq;
  return it->second.slot;
}

int CacheManager::verify_slot(int64_t seq) const {
  if (config_.num_verify_slots == 0) return -1;
  return config_.total_slots() + state_slot(seq);
}

CacheStats CacheManager::stats() const {
  CacheStats s;
  s.total_pages = config_.num_pages;
  s.free_pages = pages_.num_free();
  s.total_tokens = config_.total_tokens();
  s.free_tokens = free_tokens();
  s.total_slots = config_.num_state_slots;
  s.free_slots = free_slots();
  s.num_seqs = static_cast<int>(seqs_.size());
  s.prefix_entries = static_cast<int>(prefixes_.size());
  s.prefix_hit_tokens = prefix_hit_tokens_;
  return s;
}

}  // namespace moonrun
