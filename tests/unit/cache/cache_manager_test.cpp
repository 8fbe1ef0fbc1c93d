#include "cache/cache_manager.h"

#include <gtest/gtest.h>

#include <set>

namespace moonrun {
namespace {

CacheConfig small_config(int num_pages, int num_slots, int page_size = 4) {
  CacheConfig c;
  c.layout.kv_bytes_per_token = 24;
  c.layout.state_bytes_per_slot = 100;
  c.page_size_tokens = page_size;
  c.num_pages = num_pages;
  c.num_state_slots = num_slots;
  return c;
}

// The state commands queued so far.
std::pair<std::vector<StateCopy>, std::vector<StateCopy>> copies(CacheManager& cache) {
  std::pair<std::vector<StateCopy>, std::vector<StateCopy>> c;
  cache.take_state_copies(c.first, c.second);
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
  auto c = copies(cache);  // a fresh slot is zeroed before its first forward, once
  ASSERT_EQ(c.first.size(), 1u);
  EXPECT_EQ(c.first[0].src, -1);
  EXPECT_EQ(c.first[0].dst, cache.state_slot(7));
  EXPECT_TRUE(copies(cache).first.empty());
  ASSERT_TRUE(cache.allocate(7, 8));        // still 2 pages
  EXPECT_EQ(cache.page_table(7).size(), 2u);
  ASSERT_TRUE(cache.allocate(7, 9));
  EXPECT_EQ(cache.page_table(7).size(), 3u);
  EXPECT_EQ(cache.free_slots(), 1);  // the same slot
  EXPECT_TRUE(copies(cache).first.empty());

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
  const int slot = cache.state_slot(1);
  copies(cache);
  cache.free(1);
  cache.free(1);  // idempotent
  EXPECT_EQ(cache.stats().free_pages, 4);
  EXPECT_EQ(cache.free_slots(), 1);
  ASSERT_TRUE(cache.allocate(2, 16));
  EXPECT_EQ(cache.state_slot(2), slot);
  auto c = copies(cache);  // recycled: the runner must zero it
  ASSERT_EQ(c.first.size(), 1u);
  EXPECT_EQ(c.first[0].src, -1);
  EXPECT_EQ(c.first[0].dst, slot);
}

// DP attention's page groups (CacheConfig::page_groups): the ids split into equal ranges, a
// sequence's pages all from its slot's group (slot % groups: the DP rank that runs it, which
// holds that range alone), a full group refusing its own sequences while the other has room,
// and a new sequence taking a free slot whose group has room.
TEST(CacheManager, PageGroupsKeepASequencesPagesInItsSlotsGroup) {
  PageAllocator alloc(8, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(alloc.allocate(2, a, 1));
  EXPECT_EQ(a, (std::vector<int32_t>{4, 5}));
  EXPECT_FALSE(alloc.allocate(3, b, 1));  // group 1 has 2 left
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(alloc.num_free(0), 4);
  alloc.release(a[0]);
  EXPECT_EQ(alloc.num_free(1), 3);  // back to its own group
  EXPECT_EQ(alloc.num_free(0), 4);

  CacheConfig c = small_config(/*pages=*/8, /*slots=*/4);
  c.page_groups = 2;
  CacheManager cache(c);
  auto group_of = [&](int64_t seq) {
    std::set<int> groups;
    for (int32_t p : cache.page_table(seq)) groups.insert(p / 4);
    EXPECT_EQ(groups.size(), 1u) << "seq " << seq << "'s pages span groups";
    return groups.empty() ? -1 : *groups.begin();
  };
  ASSERT_TRUE(cache.allocate(1, 12));  // 3 pages
  ASSERT_TRUE(cache.allocate(2, 4));   // 1 page
  EXPECT_EQ(group_of(1), cache.state_slot(1) % 2);
  EXPECT_EQ(group_of(2), cache.state_slot(2) % 2);
  const int g1 = group_of(1);
  if (g1 == group_of(2)) {  // both in one group: it is full now, the other has 4 pages
    EXPECT_FALSE(cache.allocate(1, 16));
  } else {
    ASSERT_TRUE(cache.allocate(1, 16));  // the 4th page of its group
    EXPECT_FALSE(cache.allocate(1, 20)) << "its group is full; the other group's pages are another rank's";
  }
  EXPECT_EQ(group_of(1), g1);
  // A newcomer needing 4 pages fits only in a group with 4 free: it gets a slot there.
  cache.free(2);
  ASSERT_TRUE(cache.allocate(3, 16));
  EXPECT_NE(group_of(3), g1);
  EXPECT_EQ(group_of(3), cache.state_slot(3) % 2);
  EXPECT_FALSE(cache.allocate(4, 4)) << "both groups full";
  EXPECT_FALSE(cache.has(4));
}

TEST(CacheSizing, SplitsTheBudgetSlotsFirst) {
  // K3-shaped rows: 576 values per token per MLA layer, here 2 MLA layers in fp32:
  // 2 * 576 * 4 = 4608 bytes per token, 73728 per 16-token page.
  CacheLayout layout;
  layout.kv_bytes_per_token = 2 * 576 * 4;
  layout.state_bytes_per_slot = 1000;
  // 4 live slots and 2 prefix snapshots come first.
  auto c = size_cache_from_budget(layout, 6 * 1000 + 10 * 73728 + 5, 16, 4, 2);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->num_pages, 10);
  EXPECT_EQ(c->num_state_slots, 4);
  EXPECT_EQ(c->num_snapshot_slots, 2);
  EXPECT_EQ(c->total_tokens(), 160);
  EXPECT_EQ(c->kv_bytes() + c->state_bytes(), 6 * 1000 + 10 * 73728);
  // A token cap wins over the budget.
  auto capped = size_cache_from_budget(layout, 1 << 30, 16, 4, 0, /*max_total_tokens=*/40);
  ASSERT_TRUE(capped.is_ok());
  EXPECT_EQ(capped->num_pages, 3);
}

TEST(CacheSizing, TooSmallABudgetSaysWhy) {
  CacheLayout layout{2 * 576 * 4, 1000};
  auto c = size_cache_from_budget(layout, 4 * 1000 + 100, 16, 4, 0);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-running-requests"), std::string::npos);
  EXPECT_FALSE(size_cache_from_budget(layout, 1 << 20, 0, 4, 0).is_ok());
  EXPECT_FALSE(size_cache_from_budget(layout, 1 << 20, 16, 0, 0).is_ok());
}

// ---- the prefix cache ------------------------------------------------------------------

CacheConfig prefix_config(int num_pages, int num_slots, int num_snapshots, int block) {
  CacheConfig c = small_config(num_pages, num_slots);
  c.num_snapshot_slots = num_snapshots;
  c.prefix_block_tokens = block;
  return c;
}

std::vector<int32_t> tokens(int n, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(100 + (i * 7 + salt) % 50);
  return t;
}

// A sequence computes `prompt` in chunks ending where chunk_end says, snapshots planned at
// block boundaries and committed after each "step".
void prefill(CacheManager& cache, int64_t seq, const std::vector<int32_t>& prompt, int budget,
             std::vector<StateCopy>* snapshots = nullptr) {
  int done = cache.match_prefix(seq, prompt);
  while (done < static_cast<int>(prompt.size())) {
    const int end = cache.chunk_end(prompt, done, std::min<int>(prompt.size(), done + budget));
    ASSERT_GT(end, done);
    ASSERT_TRUE(cache.allocate(seq, end));
    cache.plan_snapshot(seq, std::span<const int32_t>(prompt).first(end));
    auto c = copies(cache);
    if (snapshots) snapshots->insert(snapshots->end(), c.second.begin(), c.second.end());
    cache.commit_snapshots([&](int64_t) { return std::span<const int32_t>(prompt); });
    done = end;
  }
}

TEST(PrefixCache, ChunksStopAtBlockBoundariesAndSnapshotThere) {
  CacheManager cache(prefix_config(64, 2, 4, 8));
  const auto p = tokens(30);
  // A 30-token prompt with budget 64: one cut at 24 (the last boundary), then 6 more tokens.
  EXPECT_EQ(cache.match_prefix(1, p), 0);
  EXPECT_EQ(cache.chunk_end(p, 0, 30), 24);
  ASSERT_TRUE(cache.allocate(1, 24));
  EXPECT_TRUE(cache.plan_snapshot(1, std::span<const int32_t>(p).first(24)));
  auto c = copies(cache);
  ASSERT_EQ(c.second.size(), 1u);
  EXPECT_EQ(c.second[0].src, cache.state_slot(1));
  EXPECT_GE(c.second[0].dst, 2);  // a snapshot slot, past the live ones
  cache.commit_snapshots([&](int64_t) { return std::span<const int32_t>(p); });
  EXPECT_EQ(cache.stats().prefix_entries, 1);
  EXPECT_EQ(cache.chunk_end(p, 24, 30), 30);  // no boundary left before the end
  // Cached already: no cut, no second snapshot.
  EXPECT_EQ(cache.chunk_end(p, 0, 30), 30);
  EXPECT_FALSE(cache.plan_snapshot(1, std::span<const int32_t>(p).first(24)));
}

TEST(PrefixCache, ASecondSequenceSharesThePagesAndRestoresTheSnapshot) {
  CacheManager cache(prefix_config(64, 4, 4, 8));
  auto a = tokens(40), b = tokens(40);
  for (int i = 33; i < 40; ++i) b[i] = 7;  // the same first 33 tokens
  std::vector<StateCopy> snaps;
  prefill(cache, 1, a, 16, &snaps);  // chunks end at 16, 32 and 40: a snapshot at each
  ASSERT_EQ(snaps.size(), 3u);
  const int free_before = cache.stats().free_pages;
  // b matches the longest cached prefix that leaves a token to compute: 32.
  EXPECT_EQ(cache.match_prefix(2, b), 32);
  auto c = copies(cache);
  ASSERT_EQ(c.first.size(), 1u);
  EXPECT_EQ(c.first[0].src, snaps[1].dst);  // the snapshot at 32
  EXPECT_EQ(c.first[0].dst, cache.state_slot(2));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(cache.page_table(2)[i], cache.page_table(1)[i]) << i;
  EXPECT_EQ(cache.stats().free_pages, free_before);  // shared, not copied
  ASSERT_TRUE(cache.allocate(2, 40));
  EXPECT_NE(cache.page_table(2)[8], cache.page_table(1)[8]);  // its own pages after the prefix
  EXPECT_EQ(cache.stats().prefix_hit_tokens, 32);
  // A prompt of exactly 32 tokens still computes its last one.
  EXPECT_EQ(cache.match_prefix(3, std::vector<int32_t>(a.begin(), a.begin() + 32)), 16);
  // A different prompt matches nothing.
  EXPECT_EQ(cache.match_prefix(4, tokens(40, 3)), 0);
}

TEST(PrefixCache, EvictionFreesTheLeastRecentlyUsedPrefixWhenPagesRunOut) {
  // 16 pages of 4 tokens; prefixes of 8 tokens (2 pages) each.
  CacheManager cache(prefix_config(16, 2, 2, 8));
  const auto a = tokens(9, 1), b = tokens(9, 2);
  prefill(cache, 1, a, 64);
  cache.free(1);
  prefill(cache, 2, b, 64);
  cache.free(2);
  EXPECT_EQ(cache.stats().prefix_entries, 2);
  EXPECT_EQ(cache.stats().free_pages, 12);  // 2 x 2 pages kept by the cache
  EXPECT_EQ(cache.match_prefix(3, a), 8);    // a is now the most recently used
  cache.free(3);
  // A third snapshot needs a slot: b (least recently used) goes.
  prefill(cache, 4, tokens(9, 3), 64);
  cache.free(4);
  EXPECT_EQ(cache.match_prefix(5, b), 0);
  EXPECT_EQ(cache.match_prefix(6, a), 8);
  cache.free(6);
  // Pages: a sequence that needs every page evicts what the cache holds.
  ASSERT_TRUE(cache.allocate(7, 64));
  EXPECT_EQ(cache.stats().prefix_entries, 0);
  EXPECT_EQ(cache.stats().free_pages, 0);
}

}  // namespace
}  // namespace moonrun
