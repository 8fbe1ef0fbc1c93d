#pragma once
// A small paged pool for the engine and scheduler tests: one MLA layer of 2-float rows, so
// page and slot accounting is exercised without a model.
#include "cache/cache_manager.h"

namespace moonrun::testing {

inline CacheConfig test_pool(int num_pages, int num_slots, int page_size) {
  CacheConfig c;
  c.layout.num_mla_layers = 1;
  c.layout.row_floats = 2;
  c.page_size_tokens = page_size;
  c.num_pages = num_pages;
  c.num_kda_slots = num_slots;
  return c;
}

}  // namespace moonrun::testing
