#pragma once
// MLA's attention ops on the GPU (twins of backend/cpu/mla.h and of CpuOps::mla_store /
// mla_attention). The latent cache is paged (KvLayer, backend/tensor.h): per token one row
// of kv_lora + rope values (576 at K3 size), bf16 (or fp32 under --dtype float32).
//
// Two evaluation orders, as on the CPU:
//   plain     one sequence at a time (prefill): kv_b expanded over one block of its
//             visible latents at a time, then per-head attention, blocks merged;
//   absorbed  the whole batch in one launch (decode): kv_b folded into the query and the
//             output, multi-query attention straight over the 576-wide rows. Every
//             per-token value (position, sequence, page table) comes from the batch's
//             device tables, so a decode step can be captured as a CUDA graph; with
//             only_short_seqs, tokens of sequences with more than kShortSeqMaxNewTokens new tokens are skipped
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

// ---- plain: one sequence (its page table `pages`, device), its keys a block at a time -----
// A chunk of n_tokens new tokens after n_past cached ones attends to the blocks [b, b + B) of
// the prefix (every key visible) and then to its own keys (causal); each block's kv_b
// expansion is made, used and dropped in turn, so the memory a chunk needs does not grow
// with the prefix (cuda_ops.cpp walks the blocks, merging by log-sum-exp).
//
// latents [n_positions, kv_lora] of positions [first, first + n_positions), in the act dtype
// (bf16 when act_bf16); with kpe, their k_pe too (bf16 [n_positions, rope]).
void mla_gather_latents(const KvLayer& cache, const int32_t* pages, int first, int n_positions, int kv_lora,
                        bool act_bf16, void* latents, bf16* kpe, cudaStream_t stream);
// CUDA cores, fp32: q [n_tokens, H, nope + rope] (the sequence's rows); kv [n_keys, H, nope + v]
// fp32 (kv_b over the latents of positions [key_begin, key_begin + n_keys)); o [n_tokens, H, v]
// normalised over that block, lse [n_tokens, H] (natural log) the block's log-sum-exp of the
// scaled scores (may be null). partials: mla_plain_partial_floats(n_tokens, H, n_keys, v).
void mla_attend_plain(const float* q, const float* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                      int n_past, int key_begin, int n_keys, const MlaShape& shape, float* o, float* lse,
                      float* partials, cudaStream_t stream);
// (o, lse) <- their softmax union with (o_blk, lse_blk) (natural logs), rows of v_dim values.
void mla_merge_blocks(float* o, float* lse, const float* o_blk, const float* lse_blk, int64_t rows, int v_dim,
                      cudaStream_t stream);

// bf16 on mma.sync for other head shapes (nope + rope and v multiples of 16; the tiny
// fixtures', mla_flash_prefill_mma.cu): kv [n_keys, H, nope + v] bf16 for positions
// [key_begin, key_begin + n_keys); o and lse (natural log) as mla_attend_plain's.
bool mla_flash_prefill_mma_supported(const MlaShape& shape);
void mla_flash_prefill_mma(const float* q, const bf16* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                           int n_past, int key_begin, int n_keys, const MlaShape& shape, float* o, float* lse,
                           cudaStream_t stream);

// The same on Hopper's warpgroup MMAs (mla_flash_prefill.cu; sm_90a, wgmma_available()) for
// nope + rope = 192 and v = 128 (K3's, K2's and Kimi Linear's heads): bf16 operands packed
// into swizzled tiles, fp32 softmax and accumulation, the merge fused into the epilogue.
bool mla_wgmma_prefill_supported(const MlaShape& shape);
size_t mla_wgmma_q_tiles_bytes(int n_tokens, int num_heads);
size_t mla_wgmma_kv_tiles_bytes(int n_keys, int num_heads);
// q [n_tokens, H, 192] fp32 -> the Q tiles.
void mla_wgmma_pack_q(const float* q, int n_tokens, int num_heads, void* q_tiles, cudaStream_t stream);
// kv [n_keys, H, nope + v] bf16 (kv_b's output) and kpe [n_keys, rope] bf16 -> the K and V tiles.
void mla_wgmma_pack_kv(const bf16* kv, const bf16* kpe, int n_keys, const MlaShape& shape, void* kv_tiles,
                       cudaStream_t stream);
// One block of n_keys keys: query i sees key j when j <= diag + i (diag = n_past - the block's
// first position). first: write o [n_tokens, H, v] and lse [n_tokens, H] (base 2); otherwise
// merge into them.
void mla_wgmma_attend(const void* q_tiles, const void* kv_tiles, int n_tokens, int n_keys, int diag, bool first,
                      const MlaShape& shape, float* o, float* lse, cudaStream_t stream);

// ---- absorbed: the batch ----------------------------------------------------------------
// q_abs[t, h] = [W_uk_h^T q_nope[t, h] | q_pe[t, h]]; q_abs [n_tokens, H, kv_lora + rope] fp32.
void mla_absorb_query(const float* q, const KvB& kv_b, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                      bool only_short_seqs, float* q_abs, cudaStream_t stream);
// o_lat [n_tokens, H, kv_lora] fp32 over each token's positions [0, pos]. bf16_math: the
// tensor-core kernel (Q and P rounded to bf16) may serve an fp8 cache; false (--dtype
// float32) keeps every product in fp32. A bf16 cache always takes it where it applies.
void mla_attend_absorbed(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                         const KvLayer& cache, bool only_short_seqs, bool bf16_math, float* o_lat, float* partials,
                         cudaStream_t stream);
// The kernel mla_attend_absorbed takes for bf16 caches of K3's row (kv_lora 512, rope 64):
// every head of a token in one block (up to 48; mla_decode_heads.cu), so each cached row is
// read once a token, the context split over mla_decode_heads_splits(n_tokens, H) blocks.
bool mla_decode_heads_applies(const MlaShape& shape, DType cache_dtype);
int mla_decode_heads_splits(int n_tokens, int num_heads);
// The warp-specialised variant of that kernel (TMA producer warp, consumer warpgroups split
// by heads; mla_decode_heads.cu): on with MOONRUN_MLA_DECODE_TMA=1 or set_mla_decode_tma
// (the op tests run both), off by default until it is measured faster.
void set_mla_decode_tma(bool on);
bool mla_decode_tma();
// With selected (DSA, issue 38): token t attends only the positions in its row of
// selected [n_tokens, k] (every token computed: only_short_seqs false), on the lock-step
// kernel (the TMA one loads whole pages).
void mla_decode_heads(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                      const KvLayer& cache, bool only_short_seqs, float* o_lat, float* partials,
                      cudaStream_t stream, const int32_t* selected = nullptr, int k = 0);
// DSA's fast kernels (issue 38): the sparse attention on the tensor cores (below), the
// top-k in few passes over a row (dsa_ops.cu); on with MOONRUN_DSA_FAST=1 or set_dsa_fast
// (the op tests run both), off by default until measured on a GPU against the reference
// kernels they sit beside.
void set_dsa_fast(bool on);
bool dsa_fast();
// mla_attend_absorbed over only the positions each token lists in its row of selected
// [n_tokens, k] I32 (DSA's top-k: increasing positions, then -1s), every token computed.
// The reference: CUDA cores, fp32 products, one block per (token, head). With dsa_fast() and
// bf16 rows (or fp8 rows and bf16_math), 16 heads a block on the tensor cores as the grouped
// absorbed decode, the selection split over mla_sparse_partial_floats' partials.
void mla_attend_sparse(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                       const KvLayer& cache, const int32_t* selected, int k, bool bf16_math, float* o_lat,
                       float* partials, cudaStream_t stream);
size_t mla_sparse_partial_floats(int n_tokens, int num_heads, int kv_lora, int k);
// o[t, h] = W_uv_h o_lat[t, h]; o [n_tokens, H, v] fp32.
void mla_expand_output(const float* o_lat, const KvB& kv_b, int n_tokens, const MlaShape& shape,
                       const BatchTables& batch, bool only_short_seqs, float* o, cudaStream_t stream);

// Scratch floats for the split-softmax partials of an attention call over n_queries
// (token, head) rows of out_dim values: the plain path needs its n_positions, the
// absorbed one splits from n_tokens and heads alone (the same for every context length,
// as a captured graph needs).
size_t mla_plain_partial_floats(int n_tokens, int num_heads, int n_positions, int v_dim);
size_t mla_absorbed_partial_floats(int n_tokens, int num_heads, int kv_lora);

}  // namespace moonrun::cuda
