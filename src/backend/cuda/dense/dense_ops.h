#pragma once
// The small per-token ops on the GPU, each the twin of a CPU op of backend/cpu (the
// reference of Ops, backend/ops.h): embedding, RMSNorm, the AttnRes mix, the gated
// activations, residual adds and products, dtype casts, row gathers. Residual-stream tensors
// stay fp32; the inputs of projections are bf16 (or fp32 under --dtype float32). All
// functions enqueue on `stream` and check their launches.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common/bf16.h"
#include "backend/ops.h"

namespace moonrun::cuda {

// out[t] = table[ids[t] - first_row] (zeros for ids outside [first_row, first_row + n_rows));
// table [n_rows, hidden] bf16 or fp32, ids [n_tokens] (device), out [n_tokens, hidden] fp32.
void embed_tokens(const bf16* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                  float* out, cudaStream_t stream);
void embed_tokens(const float* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                  float* out, cudaStream_t stream);

// y = weight * (x / sqrt(mean(x^2) + eps)) per row of [n_rows, dim], fp32 math.
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, bf16* y, cudaStream_t stream);
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y, cudaStream_t stream);

// The AttnRes mix (cpu::attn_res_mix): V = [blocks[0..n_blocks), prefix], block i at
// blocks + i * n_tokens * hidden. out may alias prefix.
void attn_res_mix(const float* prefix, const float* blocks, int n_blocks, int n_tokens, int hidden,
                  const float* w_norm, const float* w_proj, float eps, float* out, cudaStream_t stream);

// out = act(gate, up) elementwise (SiTU or SwiGLU per act), fp32 math.
void gated_activation(const float* gate, const float* up, int64_t n, const ActivationParams& act, bf16* out,
                      cudaStream_t stream);
void gated_activation(const float* gate, const float* up, int64_t n, const ActivationParams& act, float* out,
                      cudaStream_t stream);

// y = a + b; y = a * b (n elements); y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
void mul(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
void mul(const float* a, const float* b, int64_t n, bf16* y, cudaStream_t stream);
void sigmoid(float* x, int64_t n, cudaStream_t stream);  // in place
// Ops::rope_interleaved: x [rows, n_heads*head_width], cos_sin [rows, rope_dim], in place.
void rope_interleaved(float* x, int rows, int n_heads, int head_width, int rope_offset, const float* cos_sin,
                      int rope_dim, cudaStream_t stream);
void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream);
void to_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream);

// y[i] = x[rows[i]] for rows of row_bytes bytes; rows (device) [n_rows].
// Up to kCopyManyMax device copies in one launch (Ops::copy_many); pairs that are not all
// 16-byte words fall back to one cudaMemcpyAsync each.
constexpr int kCopyManyMax = 8;
struct CopyManyArgs {
  const void* src[kCopyManyMax] = {};
  void* dst[kCopyManyMax] = {};
  size_t bytes[kCopyManyMax] = {};
  int n = 0;
};
void copy_many(const CopyManyArgs& args, cudaStream_t stream);
void gather_rows(const void* x, size_t row_bytes, const int32_t* rows, int n_rows, void* y, cudaStream_t stream);

}  // namespace moonrun::cuda
