#pragma once
// MLA's attention ops on the GPU (twins of backend/cpu/mla.h and of CpuOps::mla_store /
// mla_attention). The latent cache is paged (KvLayer, backend/tensor.h): per token one row
// of kv_lora + rope values (576 at K3 size), bf16 (or fp32 under --dtype float32).
//
// Two evaluation orders, as on the CPU:
//   plain     one sequence at a time (prefill): kv_b expanded over its visible latents,
//             then per-head attention;
//   absorbed  the whole batch in one launch (decode): kv_b folded into the query and the
//             output, multi-query attention straight over the 576-wide rows. Every
//             per-token value (position, sequence, page table) comes from the batch's
//             device tables, so a decode step can be captured as a CUDA graph; with
//             only_single_token, tokens of sequences with several new tokens are skipped
//             (the plain path computes them).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/batch.h"
#include "backend/cuda/common/bf16.h"
#include "backend/ops.h"
#include "backend/tensor.h"

namespace moonrun::cuda {

// The batch's device tables the batched kernels read.
struct BatchTables {
  const int32_t* positions = nullptr;   // [n_tokens]
  const int32_t* token_seq = nullptr;   // [n_tokens]
  const BatchSeq* seqs = nullptr;       // [n_seqs]
  const int32_t* page_table = nullptr;  // the sequences' page tables
};

// kv_b as the kernels read it: [H * (nope + v), kv_lora], bf16 or fp32.
struct KvB {
  const void* w = nullptr;
  bool bf16 = true;
};

// Each token's cache row [rmsnorm(latent) * norm_w | k_pe] at its position.
// ckv [n_tokens, kv_lora + rope] fp32.
void mla_store(const float* ckv, int n_tokens, int kv_lora, int rope, const float* norm_w, float eps,
               const BatchTables& batch, const KvLayer& cache, cudaStream_t stream);

// ---- plain: one sequence (its page table `pages`, device) -------------------------------
// latents [n_positions, kv_lora] in the act dtype (bf16 when act_bf16).
void mla_gather_latents(const KvLayer& cache, const int32_t* pages, int n_positions, int kv_lora, bool act_bf16,
                        void* latents, cudaStream_t stream);
// q [n_tokens, H, nope + rope] fp32 (the sequence's rows); kv [n_past + n_tokens, H, nope + v]
// fp32 (kv_b over the latents); o [n_tokens, H, v] fp32. partials: mla_partial_floats(...).
void mla_attend_plain(const float* q, const float* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                      int n_past, const MlaShape& shape, float* o, float* partials, cudaStream_t stream);

// The same on the tensor cores (mla_flash_prefill.cu): kv bf16, bf16 operands, fp32 softmax
// and accumulation; for nope + rope and v multiples of 16 (K3: 192 and 128).
bool mla_flash_prefill_supported(const MlaShape& shape);
void mla_flash_prefill(const float* q, const bf16* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                       int n_past, const MlaShape& shape, float* o, cudaStream_t stream);

// ---- absorbed: the batch ----------------------------------------------------------------
// q_abs[t, h] = [W_uk_h^T q_nope[t, h] | q_pe[t, h]]; q_abs [n_tokens, H, kv_lora + rope] fp32.
void mla_absorb_query(const float* q, const KvB& kv_b, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                      bool only_single_token, float* q_abs, cudaStream_t stream);
// o_lat [n_tokens, H, kv_lora] fp32 over each token's positions [0, pos]. bf16_math: the
// tensor-core kernel (Q and P rounded to bf16) may serve an fp8 cache; false (--dtype
// float32) keeps every product in fp32. A bf16 cache always takes it where it applies.
void mla_attend_absorbed(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                         const KvLayer& cache, bool only_single_token, bool bf16_math, float* o_lat, float* partials,
                         cudaStream_t stream);
// o[t, h] = W_uv_h o_lat[t, h]; o [n_tokens, H, v] fp32.
void mla_expand_output(const float* o_lat, const KvB& kv_b, int n_tokens, const MlaShape& shape,
                       const BatchTables& batch, bool only_single_token, float* o, cudaStream_t stream);

// Scratch floats for the split-softmax partials of an attention call over n_queries
// (token, head) rows of out_dim values: the plain path needs its n_positions, the
// absorbed one splits from n_tokens and heads alone (the same for every context length,
// as a captured graph needs).
size_t mla_plain_partial_floats(int n_tokens, int num_heads, int n_positions, int v_dim);
size_t mla_absorbed_partial_floats(int n_tokens, int num_heads, int kv_lora);

}  // namespace moonrun::cuda
