#pragma once
// Shared by the KDA kernels (recurrent.cu, chunked.cu, kda_layer.cu): the thread layout of
// the per-column state kernels and the head_dim range it supports.
#include <string>

#include "backend/cuda/common/cuda_check.h"

namespace moonrun::cuda::kda_detail {

// State kernels: a block owns one head and kColsPerBlock v-columns (one per lane); its
// kRowWarps warps split the d_k rows, each thread keeping up to kMaxRowsPerThread of them
// in registers. So head_dim <= kRowWarps * kMaxRowsPerThread.
constexpr int kColsPerBlock = 32;
constexpr int kRowWarps = 8;
constexpr int kMaxRowsPerThread = 32;
constexpr int kMaxHeadDim = kRowWarps * kMaxRowsPerThread;  // 256 (K3: 128)

inline void check_head_dim(int head_dim, const char* what) {
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    throw CudaError(std::string(what) + ": head_dim " + std::to_string(head_dim) + " outside [1, " +
                    std::to_string(kMaxHeadDim) + "]");
}

// Sum over the 32 lanes, the result in every lane (xor butterfly: the same bits everywhere).
__device__ __forceinline__ float warp_allreduce_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace moonrun::cuda::kda_detail
