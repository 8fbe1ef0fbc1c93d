#include "cache/cache_manager.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace moonrun {

Result<CacheConfig> size_cache_from_budget(const CacheLayout& layout, int64_t budget_bytes,
                                           int page_size_tokens, int num_kda_slots,
                                           int64_t max_total_tokens) {
  if (page_size_tokens < 1)
    return invalid_argument("cache: page size must be >= 1 token, got " + std::to_string(page_size_tokens));
  if (num_kda_slots < 1)
    return invalid_argument("cache: need >= 1 KDA state slot (max running requests), got " +
                            std::to_string(num_kda_slots));
  const int64_t slots_bytes = num_kda_slots * layout.kda_slot_bytes;
  const int64_t page_bytes = layout.bytes_per_token() * page_size_tokens;
  const int64_t left_bytes = budget_bytes - slots_bytes;
  CacheConfig config;
  config.layout = layout;
  config.page_size_tokens = page_size_tokens;
  config.num_kda_slots = num_kda_slots;
  int64_t num_pages = 0;
  if (page_bytes == 0) {
    if (max_total_tokens <= 0)
      return invalid_argument("cache: the model has no MLA layer; give a max token count to size the pool");
    num_pages = (max_total_tokens + page_size_tokens - 1) / page_size_tokens;
    if (left_bytes < 0) num_pages = 0;
  } else {
    num_pages = left_bytes > 0 ? left_bytes / page_bytes : 0;
    if (max_total_tokens > 0)
      num_pages = std::min(num_pages, (max_total_tokens + page_size_tokens - 1) / page_size_tokens);
  }
  if (num_pages < 1) {
    return resource_exhausted(
        "cache: memory budget " + std::to_string(budget_bytes) + " bytes cannot hold " +
        std::to_string(num_kda_slots) + " KDA slots of " + std::to_string(layout.kda_slot_bytes) +
        " bytes plus one page of " + std::to_string(page_bytes) +
        " bytes; lower --max-running-requests or raise --mem-fraction-static");
  }
  num_pages = std::min<int64_t>(num_pages, INT32_MAX / 2);
  config.num_pages = static_cast<int>(num_pages);
  return config;
}

CacheManager::CacheManager(const CacheConfig& config)
    : config_(config), pages_(config.num_pages) {
  MR_CHECK(config.page_size_tokens >= 1) << "page_size_tokens " << config.page_size_tokens;
  MR_CHECK(config.num_kda_slots >= 0) << "num_kda_slots " << config.num_kda_slots;
  free_slots_.reserve(config.num_kda_slots);
  for (int s = config.num_kda_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  const int64_t n_floats = config.total_tokens() * config.layout.num_mla_layers * config.layout.row_floats;
  if (n_floats > 0 && config.host_rows) mla_rows_.reset(new float[n_floats]);
}

MlaPoolView CacheManager::mla_view() const {
  MlaPoolView view;
  view.base = mla_rows_.get();
  view.num_mla_layers = config_.layout.num_mla_layers;
  view.num_pages = config_.num_pages;
  view.page_size_tokens = config_.page_size_tokens;
  view.row_floats = config_.layout.row_floats;
  return view;
}

int CacheManager::pages_needed(int64_t seq, int n_tokens) const {
  const int want = (n_tokens + config_.page_size_tokens - 1) / config_.page_size_tokens;
  auto it = seqs_.find(seq);
  const int have = it == seqs_.end() ? 0 : static_cast<int>(it->second.pages.size());
  return std::max(0, want - have);
}

bool CacheManager::can_allocate(int64_t seq, int n_tokens) const {
  if (!has(seq) && free_slots_.empty()) return false;
  return pages_needed(seq, n_tokens) <= pages_.num_free();
}

bool CacheManager::allocate(int64_t seq, int n_tokens) {
  MR_CHECK(n_tokens >= 0) << "allocate(" << seq << ", " << n_tokens << ")";
  if (!can_allocate(seq, n_tokens)) return false;
  const int n_new_pages = pages_needed(seq, n_tokens);
  SeqEntry& entry = seqs_[seq];
  if (entry.kda_slot < 0) {
    entry.kda_slot = free_slots_.back();
    free_slots_.pop_back();
    entry.fresh_slot = true;
  }
  MR_CHECK(pages_.allocate(n_new_pages, entry.pages)) << "page pool changed under allocate";
  return true;
}

void CacheManager::free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t page : it->second.pages) pages_.release(page);
  if (it->second.kda_slot >= 0) free_slots_.push_back(it->second.kda_slot);
  seqs_.erase(it);
}

const std::vector<int32_t>& CacheManager::page_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  MR_CHECK(it != seqs_.end()) << "no cache for sequence " << seq;
  return it->second.pages;
}

int CacheManager::kda_slot(int64_t seq) const {
  auto it = seqs_.find(seq);
  MR_CHECK(it != seqs_.end()) << "no cache for sequence " << seq;
  return it->second.kda_slot;
}

bool CacheManager::take_fresh_slot(int64_t seq) {
  auto it = seqs_.find(seq);
  MR_CHECK(it != seqs_.end()) << "no cache for sequence " << seq;
  const bool fresh = it->second.fresh_slot;
  it->second.fresh_slot = false;
  return fresh;
}

CacheStats CacheManager::stats() const {
  CacheStats s;
  s.total_pages = config_.num_pages;
  s.free_pages = pages_.num_free();
  s.total_tokens = config_.total_tokens();
  s.free_tokens = free_tokens();
  s.total_slots = config_.num_kda_slots;
  s.free_slots = free_slots();
  s.num_seqs = static_cast<int>(seqs_.size());
  return s;
}

}  // namespace moonrun
