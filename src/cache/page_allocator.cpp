#include "cache/page_allocator.h"

#include "common/check.h"

namespace moonrun {

PageAllocator::PageAllocator(int num_pages) : num_pages_(num_pages), refs_(num_pages, 0) {
  MR_CHECK(num_pages >= 0) << "num_pages " << num_pages;
  free_.reserve(num_pages);
  // Pushed in reverse so that a fresh allocator hands out pages 0, 1, 2, ... in order.
  for (int p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

bool PageAllocator::allocate(int n, std::vector<int32_t>& out) {
  MR_CHECK(n >= 0) << "allocate(" << n << ")";
  if (n > num_free()) return false;
  for (int i = 0; i < n; ++i) {
    int32_t page = free_.back();
    free_.pop_back();
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
  if (--refs_[page] == 0) free_.push_back(page);
}

int PageAllocator::ref_count(int32_t page) const {
  MR_CHECK(page >= 0 && page < num_pages_) << "page " << page;
  return refs_[page];
}

}  // namespace moonrun
