#include "cache/page_allocator.h"

#include "common/check.h"

namespace moonrun {

PageAllocator::PageAllocator(int num_pages, int groups) : num_pages_(num_pages), refs_(num_pages, 0) {
  MR_CHECK(num_pages >= 0) << "num_pages " << num_pages;
  MR_CHECK(groups >= 1 && num_pages % groups == 0) << num_pages << " pages in " << groups << " groups";
  free_.resize(static_cast<size_t>(groups));
  const int per = num_pages / groups;
  for (int g = 0; g < groups; ++g) {
    free_[g].reserve(per);
    // Pushed in reverse so that a fresh allocator hands out a group's pages in order.
    for (int p = (g + 1) * per - 1; p >= g * per; --p) free_[g].push_back(p);
  }
}

int PageAllocator::num_free() const {
  int n = 0;
  for (const auto& f : free_) n += static_cast<int>(f.size());
  return n;
}

bool PageAllocator::allocate(int n, std::vector<int32_t>& out, int group) {
  MR_CHECK(n >= 0 && group >= 0 && group < num_groups()) << "allocate(" << n << ", group " << group << ")";
  std::vector<int32_t>& free = free_[group];
  if (n > static_cast<int>(free.size())) return false;
  for (int i = 0; i < n; ++i) {
    int32_t page = free.back();
    free.pop_back();
    MR_CHECK_EQ(refs_[page], 0);
    refs_[page] = 1;
    out.push_back(page);
  }
  return true;
}

void PageAllocator::add_ref(int32_t page) {
  MR_CHECK(page >= 0 && page < num_pages_) << "page " << page;
  MR_CHECK(refs_[page] > 0) << "add_ref on free page " << page;
  ++refs_[page];
}

void PageAllocator::release(int32_t page) {
  MR_CHECK(page >= 0 && page < num_pages_) << "page " << page;
  MR_CHECK(refs_[page] > 0) << "double free of page " << page;
  if (--refs_[page] == 0) free_[page / pages_per_group()].push_back(page);
}

int PageAllocator::ref_count(int32_t page) const {
  MR_CHECK(page >= 0 && page < num_pages_) << "page " << page;
  return refs_[page];
}

}  // namespace moonrun
