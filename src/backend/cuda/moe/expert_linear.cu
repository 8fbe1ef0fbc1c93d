// The routed experts' GEMM: y = x W^T with bf16 (or fp32) activations and a W stored as
// MXFP4 codes, INT4 pack-quantized words (K3_SPEC.md §3; dequantised in registers, the "W4A16" path Hopper needs since
// it has no FP4 tensor cores) or dense bf16 / fp32 (Kimi Linear's experts). fp32
// accumulation. The CPU twin is cpu::dequantize_mxfp4 followed by cpu::matmul_xwT. The
// experts of a layer are stacked (moe_ops.h StackedExperts): expert e's matrix starts
// e * out rows into each array, so no per-expert descriptor exists.
//
// Simple first: one warp per output row, 8 rows per block, tokens in tiles of 8. Lane l reads
// 32-input chunks l, l+32, ...: one 16-byte load of codes plus one scale byte (or 64 bytes of
// bf16), dequantises the chunk once and applies it to every token of the tile, so the weight
// bytes (the decode bottleneck) stream coalesced and are read once per tile. The sum order is
// fixed (per lane in chunk order, then a butterfly), so results are run-to-run identical.
// The tensor-core kernel (expert_linear_mma.cu) takes the MXFP4 x bf16 shapes it supports;
// this one stays the reference and runs the rest (fp32 mode, dense experts, odd widths).
// INT4 experts (K2's pack-quantized) run here only, dequantised per 32-input group.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/moe/int4_pairs.h"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_pairs.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowsPerBlock = 8;  // one warp each
constexpr int kTokenTile = 8;     // tokens sharing one dequantised chunk
constexpr int kChunk = 32;        // inputs per lane step = one MXFP4 scale group

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

using Kind = StackedExperts::Kind;

// The 32 weights of chunk `c` of stacked row `row` (expert e's row r is e * out + r), as
// fp32 (code * scale: the CPU's product).
template <Kind kKind>
__device__ __forceinline__ void load_weight_chunk(const StackedExperts& m, int64_t row, int c, float w[kChunk]) {
  const int in = m.in;
  if constexpr (kKind == Kind::mxfp4) {
    const uint8_t* codes = static_cast<const uint8_t*>(m.w);
    const uint4 q = *reinterpret_cast<const uint4*>(codes + static_cast<size_t>(row) * (in / 2) + c * 16);
    const float scale = e8m0_value(m.scales[static_cast<size_t>(row) * (in / kChunk) + c]);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    // Word v: elements 8v .. 8v + 7, re-laid at load (mxfp4_pairs.h); code_of reads them back
    // one at a time (this kernel is the reference, not the fast path).
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
      for (int n = 0; n < 8; ++n) w[8 * v + n] = e2m1_value(mxfp4_pairs::code_of(words[v], n)) * scale;
  } else if constexpr (kKind == Kind::int4) {
    // The K2 release's compressed-tensors pack-quantized experts (issue 40): value i of a
    // 32-bit word at bits 4i..4i+3 as q + 8, one bf16 scale per 32 inputs (cpu/int4.h). A
    // small integer times a bf16 scale is exact in fp32: the CPU's dequantised weight.
    const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(m.w) + static_cast<size_t>(row) * (in / 8) +
                                                    static_cast<size_t>(c) * 4);
    const float scale =
        __bfloat162float(reinterpret_cast<const bf16*>(m.scales)[static_cast<size_t>(row) * (in / kChunk) + c]);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        w[8 * v + i] = static_cast<float>(static_cast<int>((words[v] >> (4 * i)) & 0xFu) - 8) * scale;
  } else if constexpr (kKind == Kind::int4_pairs) {
    // The same words re-laid at load for the fast kernels (int4_pairs.h: within 64-wide
    // slices, so chunk c is half of slice c / 2); slice_nibble reads them back one at a time.
    const uint32_t* slice =
        static_cast<const uint32_t*>(m.w) + static_cast<size_t>(row) * (in / 8) + static_cast<size_t>(c / 2) * 8;
    uint32_t words[int4_pairs::kSliceWords];
#pragma unroll
    for (int v = 0; v < int4_pairs::kSliceWords; ++v) words[v] = slice[v];
    const float scale =
        __bfloat162float(reinterpret_cast<const bf16*>(m.scales)[static_cast<size_t>(row) * (in / kChunk) + c]);
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
      w[j] = static_cast<float>(static_cast<int>(int4_pairs::slice_nibble(words, 32 * (c % 2) + j)) - 8) * scale;
  } else if constexpr (kKind == Kind::bf16) {
    const uint4* p =
        reinterpret_cast<const uint4*>(static_cast<const bf16*>(m.w) + static_cast<size_t>(row) * in + c * kChunk);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 q = p[v];
      const bf16* h = reinterpret_cast<const bf16*>(&q);
#pragma unroll
      for (int j = 0; j < 8; ++j) w[8 * v + j] = __bfloat162float(h[j]);
    }
  } else {
    const float* p = static_cast<const float*>(m.w) + static_cast<size_t>(row) * in + c * kChunk;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) w[j] = p[j];
  }
}

// acc += sum_j w[j] * x[j] over one 32-input chunk of a bf16 or fp32 row.
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
__device__ __forceinline__ float chunk_dot(const float w[kChunk], const float* x, float acc) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) acc = fmaf(w[j], x[j], acc);
  return acc;
}

// One warp: output row `row` of expert e's matrix for the rows [begin, end) of a slot list.
// Slot s reads x row s / x_row_div and writes y row s.
template <Kind kKind, typename X>
__device__ void row_times_slots(const StackedExperts& m, int e, int row, const X* __restrict__ x, int x_row_div,
                                const int* __restrict__ perm, int begin, int end, float* __restrict__ y) {
  const int lane = threadIdx.x % 32, in = m.in, out = m.out, chunks = in / kChunk;
  const int64_t stacked_row = static_cast<int64_t>(e) * out + row;
  for (int base = begin; base < end; base += kTokenTile) {
    const int n_here = min(kTokenTile, end - base);
    int slot[kTokenTile];
    float acc[kTokenTile];
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      slot[tt] = tt < n_here ? perm[base + tt] : 0;
      acc[tt] = 0.0f;
    }
    for (int c = lane; c < chunks; c += 32) {
      float w[kChunk];
      load_weight_chunk<kKind>(m, stacked_row, c, w);
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

// grid (active experts bound, row blocks): block x takes the x-th active expert's slots.
template <Kind kKind, typename X>
__global__ void grouped_linear_kernel(const X* __restrict__ x, int x_row_div, StackedExperts m, ExpertGroups g,
                                      float* __restrict__ y) {
  if (static_cast<int>(blockIdx.x) >= *g.num_active) return;
  const int e = g.active[blockIdx.x];
  const int row = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  if (row >= m.out) return;
  row_times_slots<kKind>(m, e, row, x, x_row_div, g.perm, g.offsets[e], g.offsets[e + 1], y);
}

void check_shape(const StackedExperts& w, const char* what) {
  const bool quantized = w.kind == Kind::mxfp4 || w.kind == Kind::int4 || w.kind == Kind::int4_pairs;
  const bool has = w.w != nullptr && (!quantized || w.scales != nullptr);
  // Re-laid INT4 words come in whole 64-wide slices (int4_pairs.h).
  const int multiple = w.kind == Kind::int4_pairs ? 64 : kChunk;
  if (!has || w.out <= 0 || w.in <= 0 || w.in % multiple != 0)
    throw CudaError(std::string(what) + ": need an expert matrix with in % 32 == 0, got [" + std::to_string(w.out) +
                    ", " + std::to_string(w.in) + "]");
}

template <Kind kKind, typename X>
void launch_grouped(const X* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups, int max_active,
                    float* y, cudaStream_t stream) {
  const dim3 grid(max_active, (m.out + kRowsPerBlock - 1) / kRowsPerBlock);
  grouped_linear_kernel<kKind, X><<<grid, kRowsPerBlock * 32, 0, stream>>>(x, x_row_div, m, groups, y);
  CUDA_CHECK_LAUNCH();
}

template <typename X>
void grouped_for(const X* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups, int max_active,
                 float* y, cudaStream_t stream) {
  switch (m.kind) {
    case Kind::mxfp4: return launch_grouped<Kind::mxfp4>(x, x_row_div, m, groups, max_active, y, stream);
    case Kind::bf16: return launch_grouped<Kind::bf16>(x, x_row_div, m, groups, max_active, y, stream);
    case Kind::f32: return launch_grouped<Kind::f32>(x, x_row_div, m, groups, max_active, y, stream);
    case Kind::int4: return launch_grouped<Kind::int4>(x, x_row_div, m, groups, max_active, y, stream);
    case Kind::int4_pairs: return launch_grouped<Kind::int4_pairs>(x, x_row_div, m, groups, max_active, y, stream);
  }
}

}  // namespace

void grouped_expert_linear(const void* x, bool x_bf16, int x_row_div, const StackedExperts& m,
                           const ExpertGroups& groups, int max_active, int n_tokens, float* y, cudaStream_t stream) {
  check_shape(m, "grouped_expert_linear");
  if (max_active <= 0) return;
  if (grouped_mxfp4_stream_supported(m, x_bf16, n_tokens, x))
    return grouped_mxfp4_stream(static_cast<const bf16*>(x), x_row_div, m, groups, max_active, n_tokens, y, stream);
  if (n_tokens >= kWgmmaMinTokens && grouped_mxfp4_wgmma_supported(m, x_bf16)) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (wgmma_available(device))
      return grouped_mxfp4_wgmma(static_cast<const bf16*>(x), x_row_div, m, groups, max_active, y, stream);
  }
  if (grouped_mxfp4_mma_supported(m, x_bf16))
    return grouped_mxfp4_mma(static_cast<const bf16*>(x), x_row_div, m, groups, max_active, n_tokens, y, stream);
  if (x_bf16) grouped_for(static_cast<const bf16*>(x), x_row_div, m, groups, max_active, y, stream);
  else grouped_for(static_cast<const float*>(x), x_row_div, m, groups, max_active, y, stream);
}

}  // namespace moonrun::cuda
