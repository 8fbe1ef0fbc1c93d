// The short causal depthwise conv + SiLU of KDA's q, k, v (twin of cpu::short_conv_silu,
// whose comment has the timeline convention): y[t, c] = silu(sum_j weight[c, j] *
// in[t - (K-1) + j, c]), where in[s < 0] reads the rolling window of the K-1 inputs before
// this call (oldest first). Afterwards the window holds the last K-1 inputs.
//
// Two kernels, in stream order: the outputs (one thread per (t, c), reading the old
// window), then the roll (one thread per channel). The roll is in place: row r takes
// input(T - (K-1) + r), which is either a row of x or window row T + r > r, so walking r
// upwards never reads a row this thread has already overwritten.
#include <cuda_runtime.h>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_layer.h"

namespace moonrun::cuda {

namespace {

// input(s, c): the window's rows for s < 0, this call's rows otherwise.
__device__ __forceinline__ float conv_input(const float* x, const float* window, int past, int dim, int s, int c) {
  return s < 0 ? window[static_cast<int64_t>(past + s) * dim + c] : x[static_cast<int64_t>(s) * dim + c];
}

// x, y [n_tokens, dim]; weight [dim, kernel]; window [kernel-1, dim] (read only here).
__global__ void short_conv_kernel(const float* __restrict__ x, int n_tokens, int dim,
                                  const float* __restrict__ weight, int kernel, const float* __restrict__ window,
                                  bool apply_silu, float* __restrict__ y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_tokens) * dim) return;
  const int t = static_cast<int>(idx / dim), c = static_cast<int>(idx % dim);
  const int past = kernel - 1;
  const float* wc = weight + static_cast<int64_t>(c) * kernel;
  // Oldest tap first, as the CPU twin; explicit roundings keep nvcc from fusing into FMAs
  // so that small-integer inputs give the CPU's bits exactly.
  float acc = 0.0f;
  for (int j = 0; j < kernel; ++j)
    acc = __fadd_rn(acc, __fmul_rn(wc[j], conv_input(x, window, past, dim, t - past + j, c)));
  // SiLU as the CPU writes it: acc * 1 / (1 + e^-acc).
  y[idx] = apply_silu ? acc * (1.0f / (1.0f + expf(-acc))) : acc;
}

// window [kernel-1, dim] <- the last kernel-1 rows of [window; x].
__global__ void roll_window_kernel(const float* __restrict__ x, int n_tokens, int dim, int kernel, float* window) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const int past = kernel - 1;
  for (int r = 0; r < past; ++r)
    window[static_cast<int64_t>(r) * dim + c] = conv_input(x, window, past, dim, n_tokens - past + r, c);
}

}  // namespace

void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                bool apply_silu, float* y, cudaStream_t stream) {
  if (n_tokens <= 0 || dim <= 0) return;
  if (kernel < 1) throw CudaError("short_conv: kernel " + std::to_string(kernel));
  constexpr int kThreads = 256;
  const int64_t n = static_cast<int64_t>(n_tokens) * dim;
  short_conv_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, n_tokens, dim, weight, kernel, window, apply_silu, y);
  CUDA_CHECK_LAUNCH();
  if (kernel == 1) return;  // no window to roll
  roll_window_kernel<<<(dim + kThreads - 1) / kThreads, kThreads, 0, stream>>>(x, n_tokens, dim, kernel, window);
  CUDA_CHECK_LAUNCH();
}

void short_conv_silu(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                     float* y, cudaStream_t stream) {
  short_conv(x, n_tokens, dim, weight, kernel, window, /*apply_silu=*/true, y, stream);
}

}  // namespace moonrun::cuda
