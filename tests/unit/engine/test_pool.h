#pragma once
// A small paged pool for the engine and scheduler tests: page and slot accounting without a
// model (the fake runner keeps its own rows).
#include "cache/cache_manager.h"

namespace moonrun::testing {

inline CacheConfig test_pool(int num_pages, int num_slots, int page_size) {
  CacheConfig c;
  c.layout.kv_bytes_per_token = 8;
  c.layout.state_bytes_per_slot = 16;
  c.page_size_tokens = page_size;
  c.num_pages = num_pages;
  c.num_state_slots = num_slots;
  return c;
}

}  // namespace moonrun::testing
