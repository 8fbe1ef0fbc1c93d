#pragma once
// All per-sequence state of a hybrid model, as bookkeeping over ids (the memory behind
// them is the runner's pools, runtime/):
//   - the paged KV pool: per token and KV layer one row (MLA's 576-wide latent at K3
//     size), grouped in pages of page_size_tokens; a sequence owns a page table covering
//     its tokens, and a page may be shared (reference counted) by a cached prefix;
//   - the state slots: per sequence one fixed-size slot (K3: conv windows + the recurrent S
//     of every KDA layer), whatever the sequence length; slots [0, num_state_slots) are for
//     live sequences, the next num_snapshot_slots hold snapshots of a state at a block
//     boundary, for the prefix cache;
//   - the prefix cache: a prompt prefix of whole blocks (prefix_block_tokens, a multiple of
//     the page size) whose KV pages are kept and whose state was snapshotted at its end.
//     A new sequence that starts with such a prefix shares its pages, restores the snapshot
//     into its own slot, and computes only the rest (SGLang's radix cache, adapted to a
//     recurrent state: the state can only be resumed where it was saved).
// The scheduler asks in tokens ("can this sequence grow to n tokens?"); the answer covers
// both pools at once, all or nothing, evicting cached prefixes (least recently used first)
// when pages or snapshot slots run short. The slot commands (zero a fresh slot, restore a
// snapshot, take a snapshot) are handed to the runner with the step.
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/page_allocator.h"
#include "common/dtype.h"
#include "common/status.h"

namespace moonrun {

// What one token and one sequence cost, from the model's shape and the backend's dtypes.
struct CacheLayout {
  int64_t kv_bytes_per_token = 0;    // over all KV layers
  int64_t state_bytes_per_slot = 0;  // one sequence's recurrent state
  // The KV pool's element type (--kv-cache-dtype); unset: the backend's activation dtype.
  std::optional<DType> kv_dtype;
};

struct CacheConfig {
  CacheLayout layout;
  int page_size_tokens = 16;
  int num_pages = 0;
  int num_state_slots = 0;      // live sequences (one slot each: the running-request cap)
  int num_snapshot_slots = 0;   // prefix-cache snapshots
  int prefix_block_tokens = 0;  // > 0: prefix caching on, snapshots at multiples of this
  // Speculative decoding: 0, or one more slot per live slot (live slot s has total_slots() + s),
  // where a step that verifies drafts keeps the state it started from for the rollback.
  int num_verify_slots = 0;
  // DP attention (RuntimeOptions::dp_attention): the pages split into this many equal ranges,
  // range r held by rank r alone; a sequence in state slot s takes its pages from range
  // s % page_groups (the rank that runs it: ModelRunner::step_dp), so each rank allocates
  // num_pages / page_groups of them. 1 otherwise.
  int page_groups = 1;
  int64_t total_tokens() const { return static_cast<int64_t>(num_pages) * page_size_tokens; }
  int total_slots() const { return num_state_slots + num_snapshot_slots; }
  int all_slots() const { return total_slots() + num_verify_slots; }
  int64_t kv_bytes() const { return total_tokens() * layout.kv_bytes_per_token; }
  int64_t state_bytes() const { return all_slots() * layout.state_bytes_per_slot; }
};

// Splits a byte budget between the pools: the state slots first (live + snapshot), every
// remaining byte to KV pages. max_total_tokens > 0 caps the pages (and must be given when
// the model keeps no KV). Fails with a message naming the numbers when the budget cannot
// hold the slots plus one page.
Result<CacheConfig> size_cache_from_budget(const CacheLayout& layout, int64_t budget_bytes, int page_size_tokens,
                                           int num_state_slots, int num_snapshot_slots, int64_t max_total_tokens = 0,
                                           int num_verify_slots = 0);

// A state-slot command for the runner: copy slot src to slot dst, or zero dst when src < 0.
struct StateCopy {
  int src = -1;
  int dst = -1;
};

struct CacheStats {
  int64_t total_tokens = 0;  // pool capacity in tokens (num_pages * page_size)
  int64_t free_tokens = 0;   // tokens in free pages
  int total_pages = 0, free_pages = 0;
  int total_slots = 0, free_slots = 0;  // live-sequence slots
  int num_seqs = 0;                     // sequences holding cache
  int prefix_entries = 0;               // cached prefixes
  int64_t prefix_hit_tokens = 0;        // prompt tokens served from the prefix cache so far
  double usage() const {                // fraction of KV pages in use, for /metrics
    return total_pages ? 1.0 - static_cast<double>(free_pages) / total_pages : 0.0;
  }
};

class CacheManager {
 public:
  explicit CacheManager(const CacheConfig& config);

  const CacheConfig& config() const { return config_; }
  int page_size_tokens() const { return config_.page_size_tokens; }
  bool prefix_caching() const { return config_.prefix_block_tokens > 0 && config_.num_snapshot_slots > 0; }

  // For a sequence without cache yet: the longest cached prefix of `tokens` that leaves at
  // least one token to compute. Its pages are shared and its snapshot is queued for restore
  // into a fresh slot; returns how many tokens it covers (0: no match, nothing changed).
  int match_prefix(int64_t seq, std::span<const int32_t> tokens);

  // Grows seq's cache so that it covers n_tokens tokens: a state slot when the sequence has
  // none yet, and pages for ceil(n_tokens / page_size). All or nothing: false (and no
  // change) when either pool is short after evicting what the prefix cache can give up.
  bool allocate(int64_t seq, int n_tokens);
  // Returns every page and the slot of seq (abort, finish, preemption). No-op if unknown.
  void free(int64_t seq);

  // Prefix caching: where a prefill chunk of seq over token positions [from, to) should stop
  // so that the state can be snapshotted at a block boundary not yet cached (to itself when
  // nothing needs saving). `tokens` are the sequence's known tokens.
  int chunk_end(std::span<const int32_t> tokens, int from, int to) const;
  // When `prefix` (seq's first tokens after this step) ends at an uncached block boundary:
  // reserves a snapshot slot (evicting the least recently used prefix if needed) and queues
  // the copy of seq's state after the step. False when nothing was planned.
  bool plan_snapshot(int64_t seq, std::span<const int32_t> prefix);
  // After the step's forward: the planned snapshots become cached prefixes of `tokens_of(seq)`.
  void commit_snapshots(const std::function<std::span<const int32_t>(int64_t seq)>& tokens_of);
  // A step run apart from the others (the prefill lane, runtime/prefill_lane.h): its planned
  // snapshots taken out of the coming step's, so that no other step commits them before its
  // forward wrote them; committed with commit_snapshots(planned, ...) once it has.
  struct PendingSnapshot {
    int64_t seq;
    int n_tokens;
    int slot;
  };
  std::vector<PendingSnapshot> take_planned_snapshots();
  void commit_snapshots(std::vector<PendingSnapshot> planned,
                        const std::function<std::span<const int32_t>(int64_t seq)>& tokens_of);
  // The slot commands of the coming step: before the forward (zero or restore a slot), after
  // it (take a snapshot). Cleared by the call.
  void take_state_copies(std::vector<StateCopy>& before, std::vector<StateCopy>& after);

  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  const std::vector<int32_t>& page_table(int64_t seq) const;
  int state_slot(int64_t seq) const;
  // Where seq's state is kept while a step verifies its drafts (CacheConfig::num_verify_slots);
  // -1 when the cache has no such slots.
  int verify_slot(int64_t seq) const;

  CacheStats stats() const;
  int64_t free_tokens() const { return static_cast<int64_t>(pages_.num_free()) * config_.page_size_tokens; }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }

 private:
  struct SeqEntry {
    std::vector<int32_t> pages;  // page table: token t lives in pages[t / page_size]
    int slot = -1;
  };
  struct PrefixEntry {
    std::vector<int32_t> tokens;  // the prefix itself (hash collisions are checked against it)
    std::vector<int32_t> pages;   // its KV pages, one reference each
    int snapshot_slot = -1;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: least recently used)
  };
  int pages_needed(int64_t seq, int n_tokens) const;
  bool take_slot(SeqEntry& entry);
  bool allocate_in_group(int64_t seq, int n_new_pages);  // CacheConfig::page_groups > 1
  // Frees the least recently used prefix; false when there is none.
  bool evict_one();
  void touch(uint64_t key);
  const PrefixEntry* find_prefix(std::span<const int32_t> tokens, uint64_t key) const;
  static uint64_t prefix_key(std::span<const int32_t> tokens);

  CacheConfig config_;
  PageAllocator pages_;
  std::vector<int32_t> free_slots_;           // live-sequence slots, LIFO
  std::vector<int32_t> free_snapshot_slots_;  // snapshot slots, LIFO
  std::unordered_map<int64_t, SeqEntry> seqs_;
  std::unordered_map<uint64_t, PrefixEntry> prefixes_;
  std::list<uint64_t> lru_;
  std::vector<PendingSnapshot> pending_;
  std::vector<StateCopy> before_, after_;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace moonrun
