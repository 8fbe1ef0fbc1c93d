// The paged latent cache of one MLA layer: writing the new rows, reading the latents back.
// CPU twin: CpuOps::mla_store and the latent copy at the top of cpu::mla_attend_plain.
//
// Row of position p (kv_lora + rope values, 576 at K3 size):
//   [ RMSNorm(latent) * kv_a_layernorm  (kv_lora) | k_pe (rope, as projected: NoPE) ]
// The norm runs in fp32 on the fp32 projection; only the stored row is rounded (bf16 or fp8).
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/mla/mla_device.cuh"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

// One block per new token: its row at its position, through its sequence's page table.
template <typename Cache>
__global__ void store_rows_kernel(const float* __restrict__ ckv, int kv_lora, int rope,
                                  const float* __restrict__ norm_weight, float eps, BatchTables b,
                                  PagedRows<Cache> cache) {
  __shared__ float red[kWarps];
  const int t = blockIdx.x;
  const int row_width = kv_lora + rope;
  const float* src = ckv + static_cast<int64_t>(t) * row_width;
  float ss = 0;
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) ss += src[i] * src[i];
  ss = block_sum(ss, red);
  // The CPU's order: inv = 1 / sqrt(mean + eps), then weight * (x * inv).
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(kv_lora) + eps);
  const BatchSeq seq = b.seqs[b.token_seq[t]];
  Cache* row = cache.at(b.page_table + seq.page_start, b.positions[t]);
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) st(row + i, norm_weight[i] * (src[i] * inv));
  for (int i = threadIdx.x; i < rope; i += kThreads) st(row + kv_lora + i, src[kv_lora + i]);
}

// One block per position first + i: the row's first kv_lora values, converted to the act
// dtype, and (when kpe is given) its k_pe as bf16.
template <typename Cache, typename Out>
__global__ void gather_latents_kernel(PagedRows<Cache> cache, const int32_t* __restrict__ pages, int first,
                                      int kv_lora, int rope, Out* __restrict__ latents,  // [n_positions, kv_lora]
                                      bf16* __restrict__ kpe) {                            // [n_positions, rope]
  const int i = blockIdx.x;
  const Cache* row = cache.at(pages, first + i);
  Out* dst = latents + static_cast<int64_t>(i) * kv_lora;
  for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) st(dst + j, ld(row + j));
  if (kpe)
    for (int j = threadIdx.x; j < rope; j += blockDim.x) st(kpe + static_cast<int64_t>(i) * rope + j, ld(row + kv_lora + j));
}

}  // namespace

void mla_store(const float* ckv, int n_tokens, int kv_lora, int rope, const float* norm_w, float eps,
               const BatchTables& batch, const KvLayer& cache, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    store_rows_kernel<Cache><<<n_tokens, kThreads, 0, stream>>>(ckv, kv_lora, rope, norm_w, eps, batch,
                                                                paged_rows<Cache>(cache));
  });
  CUDA_CHECK_LAUNCH();
}

void mla_gather_latents(const KvLayer& cache, const int32_t* pages, int first, int n_positions, int kv_lora,
                        bool act_bf16, void* latents, bf16* kpe, cudaStream_t stream) {
  if (n_positions <= 0) return;
  const int rope = cache.row_width - kv_lora;
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    if (act_bf16)
      gather_latents_kernel<<<n_positions, 128, 0, stream>>>(paged_rows<Cache>(cache), pages, first, kv_lora, rope,
                                                              static_cast<bf16*>(latents), kpe);
    else
      gather_latents_kernel<<<n_positions, 128, 0, stream>>>(paged_rows<Cache>(cache), pages, first, kv_lora, rope,
                                                              static_cast<float*>(latents), kpe);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
