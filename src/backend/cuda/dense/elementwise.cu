// Elementwise ops: the gated activations (twins of cpu::situ and cpu::silu_mul in
// cpu/activations.h), the residual add, products, sigmoid, the casts and row gathers.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/dense_ops.h"
#include "backend/cuda/dense/gated_act.cuh"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the kernels stride over the rest.
int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(blocks, 132 * 16));
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// out may alias gate or up (read before written, by the same thread).
template <typename Out>
__global__ void situ_kernel(const float* gate, const float* up, int64_t n, float beta, float linear_beta, Out* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(out + i, situ(gate[i], up[i], beta, linear_beta));
}

template <typename Out>
__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, Out* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(out + i, silu_mul(gate[i], up[i]));
}

template <typename Out>
__global__ void mul_kernel(const float* a, const float* b, int64_t n, Out* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(y + i, a[i] * b[i]);
}

// The CPU's expression: 1 / (1 + e^-x).
__global__ void sigmoid_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = 1.0f / (1.0f + expf(-x[i]));
}

// One thread per (row, head, pair): the pair's two values turn by the row's angle i.
__global__ void rope_interleaved_kernel(float* x, int rows, int n_heads, int head_width, int rope_offset,
                                        const float* __restrict__ cos_sin, int rope_dim) {
  const int half = rope_dim / 2;
  const int64_t n = static_cast<int64_t>(rows) * n_heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int pair = static_cast<int>(i % half);
    const int64_t rh = i / half;
    const int head = static_cast<int>(rh % n_heads);
    const int64_t row = rh / n_heads;
    float* p = x + row * n_heads * static_cast<int64_t>(head_width) + head * head_width + rope_offset + 2 * pair;
    const float c = cos_sin[row * rope_dim + pair], s = cos_sin[row * rope_dim + half + pair];
    const float x0 = p[0], x1 = p[1];
    p[0] = x0 * c - x1 * s;
    p[1] = x0 * s + x1 * c;
  }
}

__global__ void to_f32_kernel(const bf16* __restrict__ x, int64_t n, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// One block per output row: 16-byte words where the row and both pointers allow (a
// 7168-float row copied a byte at a time took 21 us), else bytes.
template <typename Word>
__global__ void gather_rows_kernel(const Word* __restrict__ x, size_t row_words, const int32_t* __restrict__ rows,
                                   Word* __restrict__ y) {
  const Word* src = x + static_cast<size_t>(rows[blockIdx.x]) * row_words;
  Word* dst = y + static_cast<size_t>(blockIdx.x) * row_words;
  for (size_t i = threadIdx.x; i < row_words; i += blockDim.x) dst[i] = src[i];
}

template <typename Out>
void gated_activation_impl(const float* gate, const float* up, int64_t n, const ActivationParams& act, Out* out,
                           cudaStream_t stream) {
  if (n <= 0) return;
  if (act.situ) {
    situ_kernel<Out><<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, act.beta, act.linear_beta, out);
  } else {
    swiglu_kernel<Out><<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, out);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename Out>
void mul_impl(const float* a, const float* b, int64_t n, Out* y, cudaStream_t stream) {
  if (n <= 0) return;
  mul_kernel<Out><<<grid_for(n), kThreads, 0, stream>>>(a, b, n, y);
  CUDA_CHECK_LAUNCH();
}

// y may alias a or b: each element is read before it is written, by the same thread.
__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, bf16* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

void gated_activation(const float* gate, const float* up, int64_t n, const ActivationParams& act, bf16* out,
                      cudaStream_t stream) {
  gated_activation_impl(gate, up, n, act, out, stream);
}
void gated_activation(const float* gate, const float* up, int64_t n, const ActivationParams& act, float* out,
                      cudaStream_t stream) {
  gated_activation_impl(gate, up, n, act, out, stream);
}

void mul(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) { mul_impl(a, b, n, y, stream); }
void mul(const float* a, const float* b, int64_t n, bf16* y, cudaStream_t stream) { mul_impl(a, b, n, y, stream); }

void sigmoid(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  sigmoid_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n);
  CUDA_CHECK_LAUNCH();
}

void rope_interleaved(float* x, int rows, int n_heads, int head_width, int rope_offset, const float* cos_sin,
                      int rope_dim, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * n_heads * (rope_dim / 2);
  if (n <= 0) return;
  rope_interleaved_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, rows, n_heads, head_width, rope_offset, cos_sin,
                                                               rope_dim);
  CUDA_CHECK_LAUNCH();
}

void to_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  to_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  CUDA_CHECK_LAUNCH();
}

namespace {
// grid (blocks a pair, pairs): pair blockIdx.y copied by its blocks, 16-byte words.
__global__ void copy_many_kernel(CopyManyArgs a) {
  const int p = blockIdx.y;
  const uint4* src = static_cast<const uint4*>(a.src[p]);
  uint4* dst = static_cast<uint4*>(a.dst[p]);
  const size_t words = a.bytes[p] / 16;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
}  // namespace

void copy_many(const CopyManyArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return;
  bool words = true;
  size_t most = 0;
  for (int i = 0; i < args.n; ++i) {
    words = words && args.bytes[i] % 16 == 0 && reinterpret_cast<uintptr_t>(args.src[i]) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(args.dst[i]) % 16 == 0;
    most = std::max(most, args.bytes[i]);
  }
  if (!words) {  // not 16-byte words: one copy each
    for (int i = 0; i < args.n; ++i)
      if (args.bytes[i]) CUDA_CHECK(cudaMemcpyAsync(args.dst[i], args.src[i], args.bytes[i], cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (most == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((most / 16 + kThreads - 1) / kThreads, 256));
  copy_many_kernel<<<dim3(blocks, args.n), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const void* x, size_t row_bytes, const int32_t* rows, int n_rows, void* y, cudaStream_t stream) {
  if (n_rows <= 0 || row_bytes == 0) return;
  if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0)
    gather_rows_kernel<uint4><<<n_rows, kThreads, 0, stream>>>(static_cast<const uint4*>(x), row_bytes / 16, rows,
                                                               static_cast<uint4*>(y));
  else
    gather_rows_kernel<char><<<n_rows, kThreads, 0, stream>>>(static_cast<const char*>(x), row_bytes, rows,
                                                              static_cast<char*>(y));
  CUDA_CHECK_LAUNCH();
}

void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, n, y);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
