// The routed experts' GEMM over INT4 weights (the K2 release's compressed-tensors
// pack-quantized experts, issue 40): y = x W^T with bf16 or fp32 activations, W dequantised
// in registers as (u4 - 8) * scale, fp32 accumulation. The CPU twin is
// cpu::dequantize_int4_g32 followed by cpu::matmul_xwT; every dequantised weight is the same
// fp32 value there (a small integer times a bf16 scale is exact in fp32), so the two differ
// only in the order of the sums.
//
// Correctness first, the shape of expert_linear.cu's reference kernel: one warp per output
// row, 8 rows per block, tokens in tiles of 8. Lane l reads the 32-input groups l, l+32, ...:
// one 16-byte load of four words (32 values) plus one bf16 scale, dequantised once and applied
// to every token of the tile, so the weight bytes (the decode bottleneck) stream coalesced and
// are read once per tile. The sum order is fixed (per lane in group order, then a butterfly),
// so results are run-to-run identical. A tensor-core path (as MXFP4's) is later work.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_ops.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowsPerBlock = 8;  // one warp each
constexpr int kTokenTile = 8;     // tokens sharing one dequantised group
constexpr int kGroup = 32;        // inputs per scale = inputs per lane step
constexpr int kWordsPerGroup = kGroup / 8;

// The 32 weights of group `g` of stacked row `row` (expert e's row r is e * out + r) as fp32.
// Value i of a word sits at bits 4i..4i+3 as q + 8 (cpu/int4.h).
__device__ __forceinline__ void load_int4_group(const uint32_t* __restrict__ words, const bf16* __restrict__ scales,
                                                int in, int64_t row, int g, float w[kGroup]) {
  const size_t first_word = static_cast<size_t>(row) * (in / 8) + static_cast<size_t>(g) * kWordsPerGroup;
  const uint4 q = *reinterpret_cast<const uint4*>(words + first_word);
  const float scale = __bfloat162float(scales[static_cast<size_t>(row) * (in / kGroup) + g]);
  const uint32_t packed[kWordsPerGroup] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int v = 0; v < kWordsPerGroup; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[8 * v + i] = static_cast<float>(static_cast<int>((packed[v] >> (4 * i)) & 0xFu) - 8) * scale;
}

// acc += sum_j w[j] * x[j] over one 32-input group of a bf16 or fp32 row.
__device__ __forceinline__ float group_dot(const float w[kGroup], const bf16* x, float acc) {
  const uint4* p = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint4 q = p[v];
    const bf16* h = reinterpret_cast<const bf16*>(&q);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(w[8 * v + j], __bfloat162float(h[j]), acc);
  }
  return acc;
}
__device__ __forceinline__ float group_dot(const float w[kGroup], const float* x, float acc) {
#pragma unroll
  for (int j = 0; j < kGroup; ++j) acc = fmaf(w[j], x[j], acc);
  return acc;
}

// grid (active experts bound, row blocks): block x takes the x-th active expert's slots; each
// warp one output row of that expert for all of them. Slot s reads x row s / x_row_div and
// writes y row s.
template <typename X>
__global__ void grouped_int4_kernel(const X* __restrict__ x, int x_row_div, StackedExperts m, ExpertGroups grp,
                                    float* __restrict__ y) {
  if (static_cast<int>(blockIdx.x) >= *grp.num_active) return;
  const int e = grp.active[blockIdx.x];
  const int row = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  if (row >= m.out) return;
  const int lane = threadIdx.x % 32, in = m.in, out = m.out, groups = in / kGroup;
  const uint32_t* words = static_cast<const uint32_t*>(m.w);
  const bf16* scales = reinterpret_cast<const bf16*>(m.scales);
  const int64_t stacked_row = static_cast<int64_t>(e) * out + row;
  const int begin = grp.offsets[e], end = grp.offsets[e + 1];
  for (int base = begin; base < end; base += kTokenTile) {
    const int n_here = min(kTokenTile, end - base);
    int slot[kTokenTile];
    float acc[kTokenTile];
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      slot[tt] = tt < n_here ? grp.perm[base + tt] : 0;
      acc[tt] = 0.0f;
    }
    for (int g = lane; g < groups; g += 32) {
      float w[kGroup];
      load_int4_group(words, scales, in, stacked_row, g, w);
#pragma unroll
      for (int tt = 0; tt < kTokenTile; ++tt)
        if (tt < n_here)
          acc[tt] = group_dot(w, x + static_cast<size_t>(slot[tt] / x_row_div) * in + g * kGroup, acc[tt]);
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      float a = acc[tt];
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(kFullMask, a, off);
      if (lane == 0 && tt < n_here) y[static_cast<size_t>(slot[tt]) * out + row] = a;
    }
  }
}

template <typename X>
void launch(const X* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups, int max_active, float* y,
            cudaStream_t stream) {
  const dim3 grid(max_active, (m.out + kRowsPerBlock - 1) / kRowsPerBlock);
  grouped_int4_kernel<X><<<grid, kRowsPerBlock * 32, 0, stream>>>(x, x_row_div, m, groups, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void grouped_int4_linear(const void* x, bool x_bf16, int x_row_div, const StackedExperts& m,
                         const ExpertGroups& groups, int max_active, float* y, cudaStream_t stream) {
  if (m.kind != StackedExperts::Kind::int4 || m.w == nullptr || m.scales == nullptr || m.out <= 0 || m.in <= 0 ||
      m.in % kGroup != 0)
    throw CudaError("grouped_int4_linear: need INT4 experts (words and scales) with in % 32 == 0, got [" +
                    std::to_string(m.out) + ", " + std::to_string(m.in) + "]");
  if (max_active <= 0) return;
  if (x_bf16) launch(static_cast<const bf16*>(x), x_row_div, m, groups, max_active, y, stream);
  else launch(static_cast<const float*>(x), x_row_div, m, groups, max_active, y, stream);
}

}  // namespace moonrun::cuda
