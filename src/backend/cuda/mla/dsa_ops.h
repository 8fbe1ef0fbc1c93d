#pragma once
// DeepSeek Sparse Attention's indexer on the GPU (issue 38): the twins of CpuOps'
// dsa_index_store, dsa_index_scores and dsa_topk (backend/ops.h says what each computes).
// The indexer-key pool is F32 [pages * page_size, dim], paged like the latent rows.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/mla/mla_ops.h"

namespace moonrun::cuda {

// pool row of each token's position <- LayerNorm(k[t]) * norm_w + norm_b; k [n_tokens, dim].
void dsa_index_store(const float* k, int n_tokens, int dim, const float* norm_w, const float* norm_b, float eps,
                     const BatchTables& batch, const KvLayer& pool, cudaStream_t stream);
// Both over a block of the batch's tokens: row r is token first_token + r.
// scores [n_tokens, cols]: column p <= positions[t] is sum_h weights[t, h] * scale *
// ReLU(q[t, h] . key[p]), the others -inf. q [n_tokens, heads * dim], weights [n_tokens, heads].
// With dsa_fast(), bf16_math and an FP8 pool (dim 128, heads a multiple of 8 up to 32) on the
// tensor cores with the query rounded to bf16; otherwise fp32 on CUDA cores (the reference).
void dsa_index_scores(const float* q, const float* weights, int first_token, int n_tokens, int heads, int dim,
                      float scale, const BatchTables& batch, const KvLayer& pool, bool bf16_math, float* scores,
                      int64_t cols, cudaStream_t stream);
// indices [n_tokens, k]: each token's top k of columns [0, positions[t]] by (score
// descending, position ascending), as increasing positions, then -1s.
// With dsa_fast(), long rows of few tokens are selected in two kernels (slices, then their
// union) through a workspace of dsa_topk_workspace_bytes (0: none needed).
void dsa_topk(const float* scores, int first_token, int n_tokens, int64_t cols, const BatchTables& batch, int k,
              int32_t* indices, void* workspace, cudaStream_t stream);
size_t dsa_topk_workspace_bytes(int n_tokens, int64_t cols, int k);

}  // namespace moonrun::cuda
