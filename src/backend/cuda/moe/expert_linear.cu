// The routed experts' GEMM: y = x W^T with bf16 activations and a W stored as MXFP4 codes
// (K3_SPEC.md §3; dequantised in registers, the "W4A16" path Hopper needs since it has no FP4
// tensor cores) or as bf16 (Kimi Linear's experts). fp32 accumulation. The CPU twin is
// cpu::dequantize_mxfp4 followed by cpu::matmul_xwT.
//
// Simple first: one warp per output row, 8 rows per block, tokens in tiles of 8. Lane l reads
// 32-input chunks l, l+32, ...: one 16-byte load of codes plus one scale byte (or 64 bytes of
// bf16), dequantises the chunk once and applies it to every token of the tile, so the weight
// bytes (the decode bottleneck) stream coalesced and are read once per tile. The sum order is
// fixed (per lane in chunk order, then a butterfly), so results are run-to-run identical.
// Tensor-core MMA with in-register dequantisation (Marlin-style) is the known next step.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_internal.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowsPerBlock = 8;  // one warp each
constexpr int kTokenTile = 8;     // tokens sharing one dequantised chunk
constexpr int kChunk = 32;        // inputs per lane step = one MXFP4 scale group
constexpr int kPlainTokensPerBlock = 64;

// E2M1 (sign bit 3; magnitude index bits 0-2 into {0, .5, 1, 1.5, 2, 3, 4, 6}) as fp32 bits:
// index c >= 2 is 2^((c>>1) - 1) * (1 + (c&1)/2), i.e. exponent field 126 + (c>>1) and the top
// mantissa bit c&1; c = 1 is 0.5 (exponent 126); c = 0 is zero. Exact, branch-light.
__device__ __forceinline__ float e2m1_value(uint32_t nibble) {
  const uint32_t c = nibble & 7u;
  uint32_t bits = c >= 2 ? ((126u + (c >> 1)) << 23) | ((c & 1u) << 22) : (c == 1 ? (126u << 23) : 0u);
  bits |= (nibble & 8u) << 28;
  return __uint_as_float(bits);
}
// E8M0: 2^(s - 127); s = 0 is the fp32 subnormal 2^-127, s = 255 is NaN (cpu::e8m0_scale).
__device__ __forceinline__ float e8m0_value(uint32_t s) {
  if (s == 0) return __uint_as_float(0x00400000u);
  if (s == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(s << 23);
}

// The 32 weights of chunk `c` of row `row`, as fp32 (code * scale: the CPU's product).
template <bool kMxfp4>
__device__ __forceinline__ void load_weight_chunk(const DeviceExpertMatrix& m, int row, int c, float w[kChunk]) {
  const int in = m.in_features;
  if constexpr (kMxfp4) {
    const uint4 q = *reinterpret_cast<const uint4*>(m.codes + static_cast<size_t>(row) * (in / 2) + c * 16);
    const float scale = e8m0_value(m.scales[static_cast<size_t>(row) * (in / kChunk) + c]);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int b = 0; b < 16; ++b) {  // byte b: element 2b in the low nibble, 2b+1 in the high
      const uint32_t byte = (words[b / 4] >> (8 * (b % 4))) & 0xffu;
      w[2 * b] = e2m1_value(byte & 0xfu) * scale;
      w[2 * b + 1] = e2m1_value(byte >> 4) * scale;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(m.w + static_cast<size_t>(row) * in + c * kChunk);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 q = p[v];
      const bf16* h = reinterpret_cast<const bf16*>(&q);
#pragma unroll
      for (int j = 0; j < 8; ++j) w[8 * v + j] = __bfloat162float(h[j]);
    }
  }
}

// acc += sum_j w[j] * x[j] over one 32-input chunk of a bf16 row.
__device__ __forceinline__ float chunk_dot(const float w[kChunk], const bf16* x, float acc) {
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

// One warp: output row `row` of m for the rows [begin, end) of a slot list. Slot s reads x
// row s / x_row_div and writes y row s; perm == null means slot = position.
template <bool kMxfp4>
__device__ void row_times_slots(const DeviceExpertMatrix& m, int row, const bf16* __restrict__ x, int x_row_div,
                                const int* __restrict__ perm, int begin, int end, float* __restrict__ y) {
  const int lane = threadIdx.x % 32, in = m.in_features, out = m.out_features, chunks = in / kChunk;
  for (int base = begin; base < end; base += kTokenTile) {
    const int n_here = min(kTokenTile, end - base);
    int slot[kTokenTile];
    float acc[kTokenTile];
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      slot[tt] = tt < n_here ? (perm ? perm[base + tt] : base + tt) : 0;
      acc[tt] = 0.0f;
    }
    for (int c = lane; c < chunks; c += 32) {
      float w[kChunk];
      load_weight_chunk<kMxfp4>(m, row, c, w);
#pragma unroll
      for (int tt = 0; tt < kTokenTile; ++tt)
        if (tt < n_here)
          acc[tt] = chunk_dot(w, x + static_cast<size_t>(slot[tt] / x_row_div) * in + c * kChunk, acc[tt]);
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      float a = acc[tt];
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(kFullMask, a, off);
      if (lane == 0 && tt < n_here) y[static_cast<size_t>(slot[tt]) * out + row] = a;
    }
  }
}

// grid (token blocks, row blocks): plain rows of x, one matrix.
template <bool kMxfp4>
__global__ void plain_linear_kernel(const bf16* __restrict__ x, int n_tokens, DeviceExpertMatrix m,
                                    float* __restrict__ y) {
  const int row = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  if (row >= m.out_features) return;  // whole warp; no block barrier in this kernel
  const int begin = blockIdx.x * kPlainTokensPerBlock;
  row_times_slots<kMxfp4>(m, row, x, 1, nullptr, begin, min(n_tokens, begin + kPlainTokensPerBlock), y);
}

// grid (active experts bound, row blocks): block x takes the x-th active expert's slots.
template <bool kMxfp4>
__global__ void grouped_linear_kernel(const bf16* __restrict__ x, int x_row_div, const DeviceExpertMatrix* mats,
                                      ExpertGroups g, float* __restrict__ y) {
  if (static_cast<int>(blockIdx.x) >= *g.num_active) return;
  const int e = g.active[blockIdx.x];
  const DeviceExpertMatrix m = mats[e];
  const int row = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  if (row >= m.out_features) return;
  row_times_slots<kMxfp4>(m, row, x, x_row_div, g.perm, g.offsets[e], g.offsets[e + 1], y);
}

void check_shape(const DeviceExpertMatrix& w, bool mxfp4, const char* what) {
  const bool has = mxfp4 ? (w.codes && w.scales) : w.w != nullptr;
  if (!has || w.out_features <= 0 || w.in_features <= 0 || w.in_features % kChunk != 0)
    throw CudaError(std::string(what) + ": need a " + (mxfp4 ? "MXFP4" : "bf16") + " matrix with in % 32 == 0, got [" +
                    std::to_string(w.out_features) + ", " + std::to_string(w.in_features) + "]");
}

template <bool kMxfp4>
void plain_linear(const bf16* x, int n_tokens, const DeviceExpertMatrix& w, float* y, cudaStream_t stream,
                  const char* what) {
  check_shape(w, kMxfp4, what);
  if (n_tokens <= 0) return;
  const dim3 grid((n_tokens + kPlainTokensPerBlock - 1) / kPlainTokensPerBlock,
                  (w.out_features + kRowsPerBlock - 1) / kRowsPerBlock);
  plain_linear_kernel<kMxfp4><<<grid, kRowsPerBlock * 32, 0, stream>>>(x, n_tokens, w, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void mxfp4_linear(const bf16* x, int n_tokens, const DeviceExpertMatrix& w, float* y, cudaStream_t stream) {
  plain_linear<true>(x, n_tokens, w, y, stream, "mxfp4_linear");
}

void bf16_expert_linear(const bf16* x, int n_tokens, const DeviceExpertMatrix& w, float* y, cudaStream_t stream) {
  plain_linear<false>(x, n_tokens, w, y, stream, "bf16_expert_linear");
}

void grouped_expert_linear(const bf16* x, int x_row_div, const DeviceExpertMatrix* mats,
                           const DeviceExpertMatrix& shape, bool mxfp4, const ExpertGroups& groups, int max_active,
                           float* y, cudaStream_t stream) {
  check_shape(shape, mxfp4, "grouped_expert_linear");
  if (max_active <= 0) return;
  const dim3 grid(max_active, (shape.out_features + kRowsPerBlock - 1) / kRowsPerBlock);
  if (mxfp4)
    grouped_linear_kernel<true><<<grid, kRowsPerBlock * 32, 0, stream>>>(x, x_row_div, mats, groups, y);
  else
    grouped_linear_kernel<false><<<grid, kRowsPerBlock * 32, 0, stream>>>(x, x_row_div, mats, groups, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
