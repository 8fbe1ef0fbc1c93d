// The short causal depthwise conv (+ SiLU) of KDA's q, k, v over a batch (twin of
// cpu::short_conv, whose comment has the timeline convention): for token i of sequence s,
// y[i, c] = silu(sum_j weight[c, j] * in_s[i - (K-1) + j, c]), where in_s[r < 0] reads
// s's window (the K-1 inputs before this step, oldest first). Afterwards the window holds
// s's last K-1 inputs.
//
// Two kernels, in stream order: the outputs (one thread per (token, channel), reading the
// old windows), then the roll (one thread per (sequence, channel)). The roll is in place:
// row r takes input(n - (K-1) + r), which is either a row of x or window row n + r > r, so
// walking r upwards never reads a row this thread has already overwritten. When every
// sequence brings one token (a decode step), the thread of (token, channel) is the only
// reader of its window column, so it rolls it itself after reading: one launch instead of
// two (six fewer kernels a K3 decode step over two KDA layers).
#include <cuda_runtime.h>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

// input(r, c) of a sequence: its window's rows for r < 0, its rows of this step otherwise.
__device__ __forceinline__ float conv_input(const float* x, const float* window, int past, int dim, int r, int c) {
  return r < 0 ? window[static_cast<int64_t>(past + r) * dim + c] : x[static_cast<int64_t>(r) * dim + c];
}

__global__ void short_conv_kernel(const float* __restrict__ x, int n_tokens, int dim, const float* __restrict__ weight,
                                  int kernel, const int32_t* __restrict__ token_seq, const BatchSeq* __restrict__ seqs,
                                  float* __restrict__ window_base, int64_t slot_stride, bool apply_silu,
                                  bool roll_here, float* __restrict__ y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_tokens) * dim) return;
  const int t = static_cast<int>(idx / dim), c = static_cast<int>(idx % dim);
  const BatchSeq seq = seqs[token_seq[t]];
  const float* xs = x + static_cast<int64_t>(seq.token_start) * dim;
  float* window = window_base + seq.state_slot * slot_stride;
  const int past = kernel - 1, i = t - seq.token_start;
  const float* wc = weight + static_cast<int64_t>(c) * kernel;
  // Oldest tap first, as the CPU twin; explicit roundings keep nvcc from fusing into FMAs
  // so that small-integer inputs give the CPU's bits exactly.
  float acc = 0.0f;
  for (int j = 0; j < kernel; ++j)
    acc = __fadd_rn(acc, __fmul_rn(wc[j], conv_input(xs, window, past, dim, i - past + j, c)));
  // SiLU as the CPU writes it: acc * 1 / (1 + e^-acc).
  y[idx] = apply_silu ? acc * (1.0f / (1.0f + expf(-acc))) : acc;
  if (roll_here && past > 0) {  // one token (i = 0): the window becomes [window[1..]; x]
    for (int r = 0; r + 1 < past; ++r)
      window[static_cast<int64_t>(r) * dim + c] = window[static_cast<int64_t>(r + 1) * dim + c];
    window[static_cast<int64_t>(past - 1) * dim + c] = xs[c];
  }
}

// grid (channel blocks, n_seqs): each window <- the last kernel-1 rows of [window; x_s].
__global__ void roll_windows_kernel(const float* __restrict__ x, int dim, int kernel, const BatchSeq* __restrict__ seqs,
                                    float* window_base, int64_t slot_stride) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const BatchSeq seq = seqs[blockIdx.y];
  const float* xs = x + static_cast<int64_t>(seq.token_start) * dim;
  float* window = window_base + seq.state_slot * slot_stride;
  const int past = kernel - 1;
  for (int r = 0; r < past; ++r)
    window[static_cast<int64_t>(r) * dim + c] = conv_input(xs, window, past, dim, seq.n_new - past + r, c);
}

}  // namespace

void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, const int32_t* token_seq,
                const BatchSeq* seqs, int n_seqs, bool one_token_each, float* window_base, int64_t slot_stride,
                bool apply_silu, float* y, cudaStream_t stream) {
  if (n_tokens <= 0 || dim <= 0) return;
  if (kernel < 1) throw CudaError("short_conv: kernel " + std::to_string(kernel));
  constexpr int kThreads = 256;
  const int64_t n = static_cast<int64_t>(n_tokens) * dim;
  short_conv_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, n_tokens, dim, weight, kernel, token_seq, seqs, window_base, slot_stride, apply_silu, one_token_each, y);
  CUDA_CHECK_LAUNCH();
  if (kernel == 1 || one_token_each) return;  // no window, or rolled above
  roll_windows_kernel<<<dim3((dim + kThreads - 1) / kThreads, n_seqs), kThreads, 0, stream>>>(x, dim, kernel, seqs,
                                                                                             window_base, slot_stride);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
