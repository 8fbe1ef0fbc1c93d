#pragma once
// Kimi Delta Attention's ops on the GPU: the twins of backend/cpu/kda.h, over a whole
// batch. The per-sequence state lives in the runner's slot pool: sequence s's conv window /
// S of one layer at base + slot * slot_stride floats (StateLayer, backend/tensor.h). The
// decode-path kernels read every per-sequence value (token range, slot) from the batch's
// device tables, so a decode step can be captured as a CUDA graph.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/batch.h"
#include "backend/cuda/common/bf16.h"

namespace moonrun::cuda {

// Causal depthwise conv (+ SiLU when apply_silu) of every sequence's rows, continuing from
// its window, then the windows advanced. x, y [n_tokens, dim]; weight [dim, kernel].
// token_seq [n_tokens], seqs [n_seqs]: the batch's device tables.
// one_token_each: every sequence has exactly one new token (the windows roll in the same launch).
void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, const int32_t* token_seq,
                const BatchSeq* seqs, int n_seqs, bool one_token_each, float* window_base, int64_t slot_stride,
                bool apply_silu, float* y, cudaStream_t stream);

// Ops::kda_replay_inputs in one launch (replay_inputs.cu). saved: the verify step's q, k, v
// projections and g [capacity, dim], beta [capacity, num_heads]; rows: replayed token t's
// saved row; conv: q, k, v weights [dim, kernel]; window: the three windows' layer bases
// (slot_stride apart per slot); out: q, k, v, g [n_tokens, dim], beta [n_tokens, num_heads].
struct KdaReplayInputsArgs {
  const float* saved[5] = {};
  const int32_t* rows = nullptr;
  const float* conv[3] = {};
  float* window[3] = {};
  int64_t slot_stride = 0;
  const BatchSeq* seqs = nullptr;
  int dim = 0, num_heads = 0, head_dim = 0, kernel = 0;
  float q_scale = 1.0f;
  float* out[5] = {};
};
void kda_replay_inputs(const KdaReplayInputsArgs& args, int n_seqs, cudaStream_t stream);

// FLA's l2norm per row of d: x * scale / sqrt(sum(x^2) + 1e-6), in place.
void l2norm_rows(float* x, int64_t n_rows, int d, float scale, cudaStream_t stream);
// The decay gate in place over g [n_tokens, H*d] (cpu::kda_gate).
void kda_gate(float* g, int n_tokens, int num_heads, int head_dim, const float* A_log, const float* dt_bias,
              float lower_bound, cudaStream_t stream);
// FusedRMSNormGated(sigmoid) per head row of d (cpu::gated_rmsnorm); y bf16 or fp32.
void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, bf16* y,
                   cudaStream_t stream);
void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, float* y,
                   cudaStream_t stream);

// The recurrence token by token (cpu::kda_recurrent) for every sequence of the batch in
// one launch: sequence s's tokens [token_start, token_start + n_new), state S at
// S_base + slot * slot_stride. only_short_seqs: sequences with more than kShortSeqMaxNewTokens new tokens
// are left to kda_chunked. q, k, v, g, o [n_tokens, H, d]; beta [n_tokens, H].
void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const BatchSeq* seqs, int n_seqs, int num_heads, int head_dim, float* S_base, int64_t slot_stride,
                   bool only_short_seqs, float* o, cudaStream_t stream);

// The chunked WY form (cpu::kda_chunked) for one sequence's rows, on a caller-provided
// workspace of kda_chunked_workspace_floats(...) floats. chunk_size in [1, 64]; head_dim
// <= 256 here and in kda_recurrent.
int64_t kda_chunked_workspace_floats(int n_tokens, int num_heads, int head_dim, int chunk_size = 64);
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tokens,
                 int num_heads, int head_dim, float* S, float* o, float* workspace, cudaStream_t stream,
                 int chunk_size = 64);

// The same chunked form on the tensor cores (chunked_mma.cu): bf16 operands, fp32 state and
// accumulation, chunks of 64, head_dim 32, 64 or 128 (kda_chunked_mma_supported). The bf16
// mode's prefill path; kda_chunked above is the fp32 reference.
bool kda_chunked_mma_supported(int head_dim);
int64_t kda_chunked_mma_workspace_bytes(int n_tokens, int num_heads, int head_dim);
void kda_chunked_mma(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tokens,
                     int num_heads, int head_dim, float* S, float* o, void* workspace, cudaStream_t stream);

}  // namespace moonrun::cuda
