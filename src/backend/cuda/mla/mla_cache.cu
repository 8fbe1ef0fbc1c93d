// The paged bf16 latent cache of one MLA layer: writing the new rows, reading the latents
// back. CPU twin: the row loop in cpu::mla_forward (kernels/cpu/mla.cpp) and the latent copy
// at the top of its attend_plain.
//
// Row of position p (cache_row() = kv_lora + rope values, 576 at K3 size):
//   [ RMSNorm(latent) * kv_a_layernorm  (kv_lora) | k_pe (rope, as projected: NoPE) ]
// The norm runs in fp32 on the fp32 projection; only the stored row is rounded to bf16.
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/mla/mla_device.cuh"
#include "backend/cuda/mla/mla_kernels.h"

namespace moonrun::cuda::mla_detail {

namespace {

// One block per new token.
__global__ void write_cache_rows_kernel(const float* __restrict__ ckv,  // [n_tokens, kv_lora + rope]
                                        int n_past, int kv_lora, int rope, const float* __restrict__ norm_weight,
                                        float eps, DeviceMlaCache cache) {
  __shared__ float red[kWarps];
  const int t = blockIdx.x;
  const int row_width = kv_lora + rope;
  const float* src = ckv + static_cast<int64_t>(t) * row_width;
  float ss = 0;
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) ss += src[i] * src[i];
  ss = block_sum(ss, red);
  // The CPU's order: inv = 1 / sqrt(mean + eps), then weight * (x * inv).
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(kv_lora) + eps);
  bf16* row = cache_row(cache, n_past + t, row_width);
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) row[i] = __float2bfloat16_rn(norm_weight[i] * (src[i] * inv));
  for (int i = threadIdx.x; i < rope; i += kThreads) row[kv_lora + i] = __float2bfloat16_rn(src[kv_lora + i]);
}

// One block per position: a straight bf16 copy of the row's first kv_lora values.
__global__ void gather_latents_kernel(DeviceMlaCache cache, int kv_lora, int rope,
                                      bf16* __restrict__ latents) {  // [n_positions, kv_lora]
  const int p = blockIdx.x;
  const bf16* row = cache_row(cache, p, kv_lora + rope);
  bf16* dst = latents + static_cast<int64_t>(p) * kv_lora;
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) dst[i] = row[i];
}

}  // namespace

void write_cache_rows(const float* ckv, int n_tokens, int n_past, int kv_lora, int rope, const float* norm_weight,
                      float eps, const DeviceMlaCache& cache, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  write_cache_rows_kernel<<<n_tokens, kThreads, 0, stream>>>(ckv, n_past, kv_lora, rope, norm_weight, eps, cache);
  CUDA_CHECK_LAUNCH();
}

void gather_latents(const DeviceMlaCache& cache, int n_positions, int kv_lora, int rope, bf16* latents,
                    cudaStream_t stream) {
  if (n_positions <= 0) return;
  gather_latents_kernel<<<n_positions, kThreads, 0, stream>>>(cache, kv_lora, rope, latents);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda::mla_detail
