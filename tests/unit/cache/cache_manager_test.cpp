#include "cache/cache_manager.h"

#include <gtest/gtest.h>

#include <set>

namespace moonrun {
namespace {

CacheConfig small_config(int num_pages, int num_slots, int page_size = 4) {
  CacheConfig c;
  c.layout.num_mla_layers = 2;
  c.layout.row_floats = 3;
  c.page_size_tokens = page_size;
  c.num_pages = num_pages;
  c.num_kda_slots = num_slots;
  return c;
}

TEST(PageAllocator, AllOrNothingAndRefcounts) {
  PageAllocator pages(4);
  std::vector<int32_t> a;
  ASSERT_TRUE(pages.allocate(3, a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  std::vector<int32_t> b;
  EXPECT_FALSE(pages.allocate(2, b));  // only one left: nothing taken
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pages.num_free(), 1);
  pages.add_ref(a[1]);  // shared, as a prefix cache would
  EXPECT_EQ(pages.ref_count(a[1]), 2);
  pages.release(a[1]);
  EXPECT_EQ(pages.num_free(), 1);  // still held once
  pages.release(a[1]);
  EXPECT_EQ(pages.num_free(), 2);
  ASSERT_TRUE(pages.allocate(2, b));
  EXPECT_EQ(pages.num_free(), 0);
}

TEST(CacheManager, AllocateGrowsByPagesAndTakesOneSlot) {
  CacheManager cache(small_config(/*pages=*/5, /*slots=*/2));
  EXPECT_EQ(cache.stats().total_tokens, 20);
  ASSERT_TRUE(cache.allocate(7, 5));  // 5 tokens -> ceil(5/4) = 2 pages
  EXPECT_EQ(cache.page_table(7).size(), 2u);
  EXPECT_EQ(cache.free_slots(), 1);
  EXPECT_TRUE(cache.take_fresh_slot(7));
  EXPECT_FALSE(cache.take_fresh_slot(7));  // told once
  ASSERT_TRUE(cache.allocate(7, 8));        // still 2 pages
  EXPECT_EQ(cache.page_table(7).size(), 2u);
  ASSERT_TRUE(cache.allocate(7, 9));
  EXPECT_EQ(cache.page_table(7).size(), 3u);
  EXPECT_EQ(cache.free_slots(), 1);  // the same slot
  EXPECT_EQ(cache.pages_needed(7, 20), 2);
  EXPECT_EQ(cache.pages_needed(8, 1), 1);

  CacheStats s = cache.stats();
  EXPECT_EQ(s.free_pages, 2);
  EXPECT_EQ(s.free_tokens, 8);
  EXPECT_EQ(s.num_seqs, 1);
  EXPECT_DOUBLE_EQ(s.usage(), 3.0 / 5.0);
}

TEST(CacheManager, RefusesWithoutSideEffects) {
  CacheManager cache(small_config(/*pages=*/3, /*slots=*/1));
  ASSERT_TRUE(cache.allocate(1, 4));
  EXPECT_FALSE(cache.allocate(2, 1));  // no slot left
  EXPECT_FALSE(cache.has(2));
  EXPECT_FALSE(cache.allocate(1, 13));  // needs 4 pages in all, 3 exist
  EXPECT_EQ(cache.page_table(1).size(), 1u);
  EXPECT_EQ(cache.stats().free_pages, 2);
}

TEST(CacheManager, FreeReturnsPagesAndSlotAndMarksTheSlotFreshForTheNextOwner) {
  CacheManager cache(small_config(/*pages=*/4, /*slots=*/1));
  ASSERT_TRUE(cache.allocate(1, 16));
  const int slot = cache.kda_slot(1);
  EXPECT_TRUE(cache.take_fresh_slot(1));
  cache.free(1);
  cache.free(1);  // idempotent
  EXPECT_EQ(cache.stats().free_pages, 4);
  EXPECT_EQ(cache.free_slots(), 1);
  ASSERT_TRUE(cache.allocate(2, 16));
  EXPECT_EQ(cache.kda_slot(2), slot);
  EXPECT_TRUE(cache.take_fresh_slot(2));  // recycled: the runner must reset it
}

TEST(CacheManager, MlaViewRowsAreDistinctAndInsideTheBuffer) {
  const CacheConfig config = small_config(/*pages=*/3, /*slots=*/1, /*page_size=*/2);
  CacheManager cache(config);
  const MlaPoolView v = cache.mla_view();
  ASSERT_NE(v.base, nullptr);
  std::set<const float*> rows;
  for (int l = 0; l < 2; ++l)
    for (int p = 0; p < 3; ++p)
      for (int o = 0; o < 2; ++o) {
        const float* r = v.row(l, p, o);
        EXPECT_GE(r, v.base);
        EXPECT_LE(r + v.row_floats, v.base + config.total_tokens() * 2 * 3);
        rows.insert(r);
      }
  EXPECT_EQ(rows.size(), 12u);
}

TEST(CacheSizing, SplitsTheBudgetSlotsFirst) {
  // K3-shaped rows: 576 floats per token per MLA layer, here 2 MLA layers in fp32:
  // 2 * 576 * 4 = 4608 bytes per token, 73728 per 16-token page.
  CacheLayout layout;
  layout.num_mla_layers = 2;
  layout.row_floats = 576;
  layout.dtype_bytes = 4;
  layout.kda_slot_bytes = 1000;
  EXPECT_EQ(layout.bytes_per_token(), 4608);
  auto c = size_cache_from_budget(layout, 4 * 1000 + 10 * 73728 + 5, 16, 4);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->num_pages, 10);
  EXPECT_EQ(c->num_kda_slots, 4);
  EXPECT_EQ(c->total_tokens(), 160);
  EXPECT_EQ(c->mla_bytes() + c->kda_bytes(), 4 * 1000 + 10 * 73728);
  // A token cap wins over the budget.
  auto capped = size_cache_from_budget(layout, 1 << 30, 16, 4, /*max_total_tokens=*/40);
  ASSERT_TRUE(capped.is_ok());
  EXPECT_EQ(capped->num_pages, 3);
}

TEST(CacheSizing, TooSmallABudgetSaysWhy) {
  CacheLayout layout{2, 576, 4, 1000};
  auto c = size_cache_from_budget(layout, 4 * 1000 + 100, 16, 4);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-running-requests"), std::string::npos);
  EXPECT_FALSE(size_cache_from_budget(layout, 1 << 20, 0, 4).is_ok());
  EXPECT_FALSE(size_cache_from_budget(layout, 1 << 20, 16, 0).is_ok());
}

}  // namespace
}  // namespace moonrun
