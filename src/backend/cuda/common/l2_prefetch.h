#pragma once
// Pulls byte ranges of device memory into L2 without reading them into any SM: the
// weights the forward reads after a collective, prefetched on a side stream while the
// collective waits on the other ranks (Ops::prefetch_during_next_collective; issue 41).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moonrun::cuda {

constexpr int kMaxL2PrefetchRanges = 16;

struct L2PrefetchRanges {
  const void* ptr[kMaxL2PrefetchRanges] = {};
  int64_t bytes[kMaxL2PrefetchRanges] = {};
  int n = 0;
};

// A small grid (it runs beside a collective's kernel, which must keep its multiprocessor):
// on sm_90 one bulk L2 prefetch a 16 KiB piece, elsewhere one prefetch a 128-byte line.
void l2_prefetch(const L2PrefetchRanges& ranges, cudaStream_t stream);

}  // namespace moonrun::cuda
