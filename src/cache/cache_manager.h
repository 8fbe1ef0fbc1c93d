#pragma once
// One memory interface over the two per-sequence caches of a K3 model:
//   - the paged MLA latent pool: per token and MLA layer one row of kv_lora + rope floats
//     (576 at K3 size), grouped in pages of page_size_tokens; a sequence owns a page table
//     covering its tokens;
//   - the KDA state slots: per sequence one fixed-size slot (conv windows + the recurrent S
//     of every KDA layer), whatever the sequence length.
// The scheduler asks in tokens ("can this sequence grow to n tokens?"); the answer covers
// both pools at once, all or nothing. The MLA rows live in a plain float buffer owned here
// (MlaPoolView points into it); the KDA slot contents belong to the model runner, which is
// told to reset a slot whenever the slot is (re)assigned (take_fresh_slot).
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/page_allocator.h"
#include "common/status.h"
#include "model/forward_batch.h"

namespace moonrun {

// What one token and one sequence cost, from the model's shape.
struct CacheLayout {
  int num_mla_layers = 0;
  int row_floats = 0;          // kv_lora_rank + qk_rope_head_dim
  int dtype_bytes = 4;         // 4: the CPU backend keeps float rows
  int64_t kda_slot_bytes = 0;  // one sequence's KDA state, all KDA layers
  int64_t bytes_per_token() const {
    return static_cast<int64_t>(num_mla_layers) * row_floats * dtype_bytes;
  }
};

struct CacheConfig {
  CacheLayout layout;
  int page_size_tokens = 16;
  int num_pages = 0;
  int num_kda_slots = 0;
  // The CPU backend keeps the MLA rows in host memory owned here; the CUDA backend keeps
  // them on the device (its runner allocates them) and uses this class for accounting only.
  bool host_rows = true;
  int64_t total_tokens() const { return static_cast<int64_t>(num_pages) * page_size_tokens; }
  int64_t mla_bytes() const { return total_tokens() * layout.bytes_per_token(); }
  int64_t kda_bytes() const { return num_kda_slots * layout.kda_slot_bytes; }
};

// Splits a byte budget between the pools: num_kda_slots slots first (one per request that
// may run at once, so a slot never has to be waited for), every remaining byte to MLA pages.
// max_total_tokens > 0 caps the pages (and must be given when the model has no MLA layer).
// Fails with a message naming the numbers when the budget cannot hold the slots plus one
// page.
Result<CacheConfig> size_cache_from_budget(const CacheLayout& layout, int64_t budget_bytes,
                                           int page_size_tokens, int num_kda_slots,
                                           int64_t max_total_tokens = 0);

struct CacheStats {
  int64_t total_tokens = 0;  // pool capacity in tokens (num_pages * page_size)
  int64_t free_tokens = 0;   // tokens in free pages
  int total_pages = 0, free_pages = 0;
  int total_slots = 0, free_slots = 0;
  int num_seqs = 0;          // sequences holding cache
  double usage() const {     // fraction of MLA pages in use, for /metrics
    return total_pages ? 1.0 - static_cast<double>(free_pages) / total_pages : 0.0;
  }
};

class CacheManager {
 public:
  // Allocates the MLA buffer (uninitialised: rows are written before they are read).
  explicit CacheManager(const CacheConfig& config);

  const CacheConfig& config() const { return config_; }
  int page_size_tokens() const { return config_.page_size_tokens; }
  MlaPoolView mla_view() const;

  // Grows seq's cache so that it covers n_tokens tokens: a KDA slot when the sequence has
  // none yet, and pages for ceil(n_tokens / page_size). All or nothing: false (and no
  // change) when either pool is short.
  bool allocate(int64_t seq, int n_tokens);
  // Whether allocate(seq, n_tokens) would succeed now.
  bool can_allocate(int64_t seq, int n_tokens) const;
  // Pages allocate(seq, n_tokens) would add.
  int pages_needed(int64_t seq, int n_tokens) const;
  // Returns every page and the slot of seq (abort, finish, preemption). No-op if unknown.
  void free(int64_t seq);

  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  const std::vector<int32_t>& page_table(int64_t seq) const;
  int kda_slot(int64_t seq) const;
  // True exactly once after seq got its slot: the runner must zero the slot's state before
  // the sequence's first forward (a recycled slot still holds its previous owner's state).
  bool take_fresh_slot(int64_t seq);

  CacheStats stats() const;
  int64_t free_tokens() const { return static_cast<int64_t>(pages_.num_free()) * config_.page_size_tokens; }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }

 private:
  struct SeqEntry {
    std::vector<int32_t> pages;  // page table: token t lives in pages[t / page_size]
    int kda_slot = -1;
    bool fresh_slot = false;
  };

  CacheConfig config_;
  PageAllocator pages_;
  std::vector<int32_t> free_slots_;  // LIFO
  std::unordered_map<int64_t, SeqEntry> seqs_;
  std::unique_ptr<float[]> mla_rows_;  // [num_mla_layers][num_pages][page_size][row_floats]
};

}  // namespace moonrun
