#pragma once
// The routed experts on the GPU (twins of cpu::route_token and cpu::moe_experts): router
// top-k per token, the (token, k) slots grouped by expert without a host round trip, one
// GEMM per expert over its slots (W4A16 over the MXFP4 codes or the INT4 words, dequantised
// in registers; or bf16 / fp32 experts), and the weighted combine in k order.
// Deterministic: the same input gives bit-identical output.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/bf16.h"
#include "backend/ops.h"

namespace moonrun::cuda {

// Router top-k for every token: logits [n_tokens, E] fp32 -> expert_ids, weights
// [n_tokens, top_k] (device), exactly cpu::route_token's choice and order.
void router_topk(const float* logits, const float* bias, int n_tokens, const RouterParams& p, int32_t* expert_ids,
                 float* weights, cudaStream_t stream);

// One kind of expert matrix [out, in] for every expert of a layer, stacked: expert e's rows
// [e * out, (e + 1) * out) (backend/tensor.h ExpertMatrices). MXFP4: `w` the E2M1 codes
// [E * out, in/2], `scales` E8M0 [E * out, in/32]; INT4 (compressed-tensors pack-quantized,
// backend/cpu/int4.h): `w` the u32 words [E * out, in/8], `scales` the bytes of the bf16
// scales [E * out, in/32] (kept as bytes so the MXFP4 kernels' field serves both); int4_pairs:
// the same words re-laid at load for the fast kernels (int4_pairs.h, repack_int4_words; in %
// 64 == 0), same scales; dense: `w` bf16 or fp32 [E * out, in].
struct StackedExperts {
  enum class Kind { mxfp4, int4, int4_pairs, bf16, f32 };
  const void* w = nullptr;
  const uint8_t* scales = nullptr;
  Kind kind = Kind::mxfp4;
  int out = 0, in = 0;
};

// The routed slots grouped by expert, on the device. Slot s = t * top_k + k.
struct ExpertGroups {
  int* offsets = nullptr;     // [E + 1]: expert e's slots are perm[offsets[e] .. offsets[e+1])
  int* perm = nullptr;        // [n_slots]: slot ids grouped by expert, ascending within one
  int* active = nullptr;      // [E]: the experts with at least one slot, ascending
  int* num_active = nullptr;  // [1]: how many entries of `active` are valid
};

// ids [n_slots] (device, global expert ids) -> groups over the experts held here,
// [first_expert, first_expert + num_experts) (all of them at one rank); slots of other
// experts are left out. Deterministic: a stable counting sort (the CPU visits the same
// slots per expert in the same order).
void group_by_expert(const int32_t* ids, int n_slots, int first_expert, int num_experts, const ExpertGroups& groups,
                     cudaStream_t stream);

// For every active expert e and every slot s of e:  y[s, o] = sum_i x[s / x_row_div, i] * W_e[o, i]
// x: rows of width in, bf16 (x_bf16) or fp32; x_row_div = top_k reads token rows, 1 slot
// rows; y: [n_slots, out] fp32. max_active bounds the active experts (min(E, n_slots)).
void grouped_expert_linear(const void* x, bool x_bf16, int x_row_div, const StackedExperts& m,
                           const ExpertGroups& groups, int max_active, int n_tokens, float* y, cudaStream_t stream);

// The tensor-core paths of grouped_expert_linear, which takes the first that applies.
// Decode batches (expert_linear_stream.cu): bf16 x, MXFP4 weights, at most 8 tokens, in % 64
// == 0, out % 32 == 0, each block's 32-row tile bulk-copied into shared memory (16-row tiles,
// out % 16 == 0, where 32 rows of in would not fit: in past ~6k); unless
// MOONRUN_EXPERT_MULTI_PASS=0 also steps of up to 256 tokens, each block running its expert's
// slots in passes of 8 over its one copied tile (an expert gets one to three tokens at decode
// batches of 32 .. 128). Otherwise
// (expert_linear_mma.cu): bf16 x, MXFP4 weights, in % 64 == 0, out % 16 == 0. Both take
// re-laid INT4 (Kind::int4_pairs) where they take MXFP4, with the same shapes. Exposed so the
// op tests can hold the kernels against each other.
// overlap_previous: launched to overlap the kernel before it (common/overlap_launch.cuh),
// which the caller may ask for only when `groups` was written before that kernel and that
// kernel waits for it before letting this one start (the down projection after the gate/up
// launch, after the grouping).
bool grouped_mxfp4_stream_supported(const StackedExperts& m, bool x_bf16, int n_tokens, const void* x);
void grouped_mxfp4_stream(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                          int max_active, int n_tokens, float* y, cudaStream_t stream, bool overlap_previous = false);
// The gate and up projections of one shape over the same x in one launch, stored as
// h = act(gate x, up x) in bf16 ([slots, out], as gated_activation of the two
// grouped_expert_linear outputs, bit for bit).
bool grouped_mxfp4_stream_gated_supported(const StackedExperts& gate, const StackedExperts& up, bool x_bf16,
                                          int n_tokens, const void* x);
void grouped_mxfp4_stream_gated(const bf16* x, int x_row_div, const StackedExperts& gate, const StackedExperts& up,
                                const ActivationParams& act, const ExpertGroups& groups, int max_active, int n_tokens,
                                bf16* h, cudaStream_t stream);
// Prefill-sized steps on Hopper (expert_linear_wgmma.cu; sm_90a, wgmma_available()): bf16 x,
// MXFP4 weights (and re-laid INT4, whose weights it rounds to bf16: the kernel's header;
// MOONRUN_INT4_WGMMA=0 not), in % 64 == 0, out % 128 == 0; taken from kWgmmaMinTokens tokens a step.
constexpr int kWgmmaMinTokens = 512;
bool grouped_mxfp4_wgmma_supported(const StackedExperts& m, bool x_bf16);
void grouped_mxfp4_wgmma(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                         int max_active, float* y, cudaStream_t stream);
bool grouped_mxfp4_mma_supported(const StackedExperts& m, bool x_bf16);
void grouped_mxfp4_mma(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                       int max_active, int n_tokens, float* y, cudaStream_t stream);

// y[t, c] = sum_k weights[t, k] * expert_out[t * top_k + k, c], k ascending (the CPU's order).
// expert_out [n_tokens * top_k, dim], weights [n_tokens, top_k], y [n_tokens, dim] fp32. A slot
// whose id (ids [n_tokens, top_k]) is outside [first_expert, first_expert + num_experts) adds 0:
// its expert_out row is never read.
void combine_experts(const float* expert_out, const float* weights, const int32_t* ids, int first_expert,
                     int num_experts, int n_tokens, int top_k, int dim, float* y, cudaStream_t stream);

// Rewrites MXFP4 codes (bytes, whole 32-bit words) in place into the pair-ready layout every
// MXFP4 kernel here reads (mxfp4_pairs.h). Once per matrix, after its upload.
void repack_mxfp4_codes(void* codes, size_t bytes, cudaStream_t stream);
// Rewrites INT4 words [rows, in/8] (in % 64 == 0: whole 64-wide slices) in place into the
// layout of Kind::int4_pairs (int4_pairs.h). Once per matrix, after its upload.
void repack_int4_words(void* words, size_t bytes, cudaStream_t stream);

}  // namespace moonrun::cuda
