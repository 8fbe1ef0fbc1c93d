#pragma once
// The kernels mla_forward (mla_layer.cu) is made of, one launcher each. Internal to
// src/kernels/cuda/mla; the twins of the loops inside cpu::mla_forward / attend_plain /
// attend_absorbed (kernels/cpu/mla.cpp). Everything enqueues on `stream` and checks its launch.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/mla/mla_layer.h"

namespace moonrun::cuda::mla_detail {

// ---- mla_cache.cu ---------------------------------------------------------------------
// ckv [n_tokens, kv_lora + rope] fp32 (kv_a_proj_with_mqa's output) -> the cache rows of
// positions n_past .. n_past + n_tokens - 1: [RMSNorm(latent) * kv_a_layernorm | k_pe], bf16.
void write_cache_rows(const float* ckv, int n_tokens, int n_past, int kv_lora, int rope, const float* norm_weight,
                      float eps, const DeviceMlaCache& cache, cudaStream_t stream);

// The latent part of the rows of positions [0, n_positions), contiguous:
// latents [n_positions, kv_lora] bf16 (the input of kv_b in plain mode).
void gather_latents(const DeviceMlaCache& cache, int n_positions, int kv_lora, int rope, bf16* latents,
                    cudaStream_t stream);

// ---- mla_attention.cu -----------------------------------------------------------------
// Decode-sized calls split each (token, head)'s positions over several blocks and combine
// the partial softmaxes; the partials need attention_partial_floats() floats of scratch
// (0 when there is one split, then `partials` may be null). out_dim: v (plain) or kv_lora
// (absorbed).
int attention_splits(int n_tokens, int num_heads, int n_positions);
size_t attention_partial_floats(int n_tokens, int num_heads, int n_positions, int out_dim);

// Plain (prefill) attention. q [n_tokens, H, nope + rope] fp32; kv [n_past + n_tokens, H,
// nope + v] fp32 (kv_b over the latents); k_pe from the cache rows. o [n_tokens, H, v] fp32.
void attend_plain(const float* q, const float* kv, const DeviceMlaCache& cache, int n_tokens, int n_past,
                  int num_heads, int kv_lora, int nope, int rope, int v_dim, float* o, float* partials,
                  cudaStream_t stream);

// Absorbed (decode) attention, step 1: q_abs[t, h] = [W_uk_h^T q_nope[t, h] | q_pe[t, h]].
// q [n_tokens, H, nope + rope] fp32; kv_b [H * (nope + v), kv_lora] bf16;
// q_abs [n_tokens, H, kv_lora + rope] fp32.
void absorb_query(const float* q, const bf16* kv_b, int n_tokens, int num_heads, int kv_lora, int nope, int rope,
                  int v_dim, float* q_abs, cudaStream_t stream);
// Step 2: multi-query attention of q_abs over the 576-wide rows (keys = whole row, values =
// latent part). o_lat [n_tokens, H, kv_lora] fp32.
void attend_absorbed(const float* q_abs, const DeviceMlaCache& cache, int n_tokens, int n_past, int num_heads,
                     int kv_lora, int rope, int nope, float* o_lat, float* partials, cudaStream_t stream);
// Step 3: o[t, h] = W_uv_h o_lat[t, h]. o [n_tokens, H, v] fp32.
void expand_output(const float* o_lat, const bf16* kv_b, int n_tokens, int num_heads, int kv_lora, int nope,
                   int v_dim, float* o, cudaStream_t stream);

}  // namespace moonrun::cuda::mla_detail
