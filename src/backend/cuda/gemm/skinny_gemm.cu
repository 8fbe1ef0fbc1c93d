// The decode-size bf16 projection (skinny_gemm.h): one m16n8k16 MMA column per token, the
// weights streamed once.
//
// A block owns 16 output rows (one m16 tile; grid: out / 16 x batch) and its eight warps
// split the reduction: warp w takes the 64-wide k steps w, w + 8, ... Within a step, lane
// (g, t) loads 32 contiguous bytes of row g and of row g + 8 (k 16t .. 16t + 15: four lanes
// make one 128-byte line of each row) and the same 16 k of token g's x, and runs four MMAs.
// The MMA's k order is free as long as A and B agree: MMA j takes the lane's bf16 pairs 2j
// and 2j + 1 (k 16t + 4j .. + 3) as its "k 2t, 2t + 1" and "k 2t + 8, 2t + 9" for both operands,
// so no register is permuted. The next step's loads are issued before this step's MMAs (two
// steps, 4 KB a warp, in flight). The eight partial tiles are added in warp order through
// shared memory: the result does not depend on timing.
#include "backend/cuda/gemm/skinny_gemm.h"

#include <cstdint>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"

namespace moonrun::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;      // output rows a block
constexpr int kStepK = 64;     // k a warp takes a step: 4 lanes x 16
constexpr int kMaxTokens = 8;  // the MMA's n
// Blocks to fill an H200 (132 multiprocessors): below this many row tiles, cuBLASLt's
// split-K over blocks keeps more bytes in flight than eight warps a tile can.
constexpr int kMinTiles = 128;

struct StepLoads {
  uint4 a[2], b[2], x[2];  // row g, row g + 8, token g: k 16t .. 16t + 15 of the step
};

__device__ __forceinline__ void load_step(const uint4* row_a, const uint4* row_b, const uint4* xr, int step, int t,
                                          StepLoads& s) {
  const int i = step * (kStepK / 8) + 2 * t;  // in 16-byte words
  s.a[0] = __ldg(row_a + i);
  s.a[1] = __ldg(row_a + i + 1);
  s.b[0] = __ldg(row_b + i);
  s.b[1] = __ldg(row_b + i + 1);
  s.x[0] = __ldg(xr + i);
  s.x[1] = __ldg(xr + i + 1);
}

__device__ __forceinline__ void mma_step(const StepLoads& s, float acc[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a[4] = {s.a[h].x, s.a[h].y, s.a[h].z, s.a[h].w};
    const uint32_t b[4] = {s.b[h].x, s.b[h].y, s.b[h].z, s.b[h].w};
    const uint32_t x[4] = {s.x[h].x, s.x[h].y, s.x[h].z, s.x[h].w};
    mma_m16n8k16_bf16(acc, a[0], b[0], a[1], b[1], x[0], x[1]);
    mma_m16n8k16_bf16(acc, a[2], b[2], a[3], b[3], x[2], x[3]);
  }
}

__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename Out>
__global__ void __launch_bounds__(kThreads)
    skinny_linear_kernel(const bf16* __restrict__ x, int n_tokens, const bf16* __restrict__ w, int out, int in,
                         Out* __restrict__ y) {
  __shared__ float partial[kWarps - 1][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const int64_t mat = static_cast<int64_t>(blockIdx.y) * out * in;
  const uint4* row_a = reinterpret_cast<const uint4*>(w + mat + static_cast<int64_t>(row0 + g) * in);
  const uint4* row_b = reinterpret_cast<const uint4*>(w + mat + static_cast<int64_t>(row0 + g + 8) * in);
  // A lane past the last token reads the last token's x: its MMA column is never stored.
  const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(g < n_tokens ? g : n_tokens - 1) * in);
  const int n_steps = in / kStepK;
  float acc[4] = {};
  StepLoads cur, next;
  if (warp < n_steps) load_step(row_a, row_b, xr, warp, t, cur);
  for (int s = warp; s < n_steps; s += kWarps) {
    if (s + kWarps < n_steps) load_step(row_a, row_b, xr, s + kWarps, t, next);
    mma_step(cur, acc);
    cur = next;
  }
  if (warp > 0)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp - 1][i][lane] = acc[i];
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    for (int wp = 0; wp < kWarps - 1; ++wp) acc[i] += partial[wp][i][lane];
  // C fragment: rows g / g + 8, tokens 2t / 2t + 1.
  Out* yb = y + static_cast<int64_t>(blockIdx.y) * n_tokens * out;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int tok = 2 * t + j;
    if (tok >= n_tokens) continue;
    store_out(yb + static_cast<int64_t>(tok) * out + row0 + g, acc[j]);
    store_out(yb + static_cast<int64_t>(tok) * out + row0 + g + 8, acc[2 + j]);
  }
}

template <typename Out>
void launch(const bf16* x, int n_tokens, const bf16* w, int out, int in, int batch, Out* y, cudaStream_t stream) {
  if (!skinny_linear_supported(x, n_tokens, w, out, in) || batch < 1)
    throw CudaError("skinny_linear: unsupported shape " + std::to_string(n_tokens) + " x [" + std::to_string(out) +
                    ", " + std::to_string(in) + "] batch " + std::to_string(batch));
  skinny_linear_kernel<Out><<<dim3(out / kRows, batch), kThreads, 0, stream>>>(x, n_tokens, w, out, in, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool skinny_linear_supported(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features) {
  return n_tokens >= 1 && n_tokens <= kMaxTokens && in_features > 0 && in_features % kStepK == 0 &&
         out_features % kRows == 0 && out_features / kRows >= kMinTiles && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void skinny_linear(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features, int batch, float* y,
                   cudaStream_t stream) {
  launch(x, n_tokens, w, out_features, in_features, batch, y, stream);
}
void skinny_linear(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features, int batch, bf16* y,
                   cudaStream_t stream) {
  launch(x, n_tokens, w, out_features, in_features, batch, y, stream);
}

}  // namespace moonrun::cuda
