#pragma once
// Fixed-size pages of the MLA latent pool, handed out from a free list. Every page carries a
// reference count so that a prefix cache can later share a page between sequences: a page
// returns to the free list only when its last holder lets go. Pure bookkeeping over page
// ids; the memory behind the ids lives in CacheManager.
//
// Groups: the ids may be split into `groups` equal contiguous ranges with a free list each
// (DP attention: rank r holds the pages of group r only, CacheConfig::page_groups).
#include <cstdint>
#include <vector>

namespace moonrun {

class PageAllocator {
 public:
  explicit PageAllocator(int num_pages, int groups = 1);

  int num_pages() const { return num_pages_; }
  int num_groups() const { return static_cast<int>(free_.size()); }
  int pages_per_group() const { return num_pages_ / num_groups(); }
  int num_free() const;
  int num_free(int group) const { return static_cast<int>(free_[group].size()); }
  int num_used() const { return num_pages_ - num_free(); }

  // Takes n pages of `group` (refcount 1 each) and appends them to out, all or nothing:
  // returns false and leaves out untouched when fewer than n of that group are free.
  bool allocate(int n, std::vector<int32_t>& out, int group = 0);
  // Another holder of an allocated page (prefix sharing).
  void add_ref(int32_t page);
  // Drops one reference; the page is free again when none remain.
  void release(int32_t page);
  int ref_count(int32_t page) const;

 private:
  int num_pages_;
  // Per group, LIFO: the most recently freed page is reused first (warm in caches).
  std::vector<std::vector<int32_t>> free_;
  std::vector<int32_t> refs_;  // [num_pages]
};

}  // namespace moonrun
