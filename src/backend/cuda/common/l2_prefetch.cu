#include "backend/cuda/common/l2_prefetch.h"

#include "backend/cuda/common/cuda_check.h"

namespace moonrun::cuda {
namespace {

constexpr int kPrefetchBlocks = 2;
constexpr int kPrefetchThreads = 128;
constexpr int64_t kPiece = 16 * 1024;  // bytes a bulk prefetch

__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(L2PrefetchRanges r) {
  const int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t lanes = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int i = 0; i < r.n; ++i) {
    // The 16-byte aligned bytes inside the range (a bulk prefetch's address and size).
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(r.ptr[i]) + 15) & ~uintptr_t{15};
    const uintptr_t end = (reinterpret_cast<uintptr_t>(r.ptr[i]) + r.bytes[i]) & ~uintptr_t{15};
    if (end <= begin) continue;
    const int64_t n = static_cast<int64_t>(end - begin);
    for (int64_t off = lane * kPiece; off < n; off += lanes * kPiece) {
      const uintptr_t a = begin + off;
      const uint32_t size = static_cast<uint32_t>(min(kPiece, n - off));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(size) : "memory");
#else
      for (uint32_t line = 0; line < size; line += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a + line));
#endif
    }
  }
}

}  // namespace

void l2_prefetch(const L2PrefetchRanges& ranges, cudaStream_t stream) {
  if (ranges.n <= 0) return;
  l2_prefetch_kernel<<<kPrefetchBlocks, kPrefetchThreads, 0, stream>>>(ranges);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
