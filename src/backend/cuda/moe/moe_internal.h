#pragma once
// The pieces moe_forward is built from (kernels/cuda/moe/*.cu), declared for the op tests:
// group the routed (token, k) slots by expert, run one expert matrix over each expert's
// slots, and combine the slots back per token.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/bf16.h"
#include "backend/cuda/moe/moe_layer.h"

namespace moonrun::cuda {

// The routed slots grouped by expert, on the device. Slot s = t * top_k + k.
struct ExpertGroups {
  int* offsets = nullptr;     // [E + 1]: expert e's slots are perm[offsets[e] .. offsets[e+1])
  int* perm = nullptr;        // [n_slots]: slot ids grouped by expert, ascending within one
  int* active = nullptr;      // [E]: the experts with at least one slot, ascending
  int* num_active = nullptr;  // [1]: how many entries of `active` are valid
};

// ids [n_slots] (device, each < num_experts) -> groups. Deterministic: a stable counting
// sort (the CPU's moe_forward visits the same slots per expert in the same order).
void group_by_expert(const int32_t* ids, int n_slots, int num_experts, const ExpertGroups& groups,
                     cudaStream_t stream);

// For every active expert e and every slot s of e:
//   y[s, o] = sum_i x[s / x_row_div, i] * W_e[o, i]
// mats: [E] device descriptors (all of `shape`'s out/in), MXFP4 or bf16 per `mxfp4`.
// x: bf16 rows of width in (x_row_div = top_k reads token rows, 1 reads slot rows);
// y: [n_slots, out] fp32. max_active bounds the active experts (min(E, n_slots)).
void grouped_expert_linear(const bf16* x, int x_row_div, const DeviceExpertMatrix* mats,
                           const DeviceExpertMatrix& shape, bool mxfp4, const ExpertGroups& groups,
                           int max_active, float* y, cudaStream_t stream);

// The same product over plain rows with a bf16 matrix (mxfp4_linear's bf16 twin).
void bf16_expert_linear(const bf16* x, int n_tokens, const DeviceExpertMatrix& w, float* y, cudaStream_t stream);

// y[t, c] = sum_k weights[t, k] * expert_out[t * top_k + k, c], k ascending (the CPU's order).
// expert_out [n_tokens * top_k, dim], weights [n_tokens, top_k], y [n_tokens, dim] fp32.
void combine_experts(const float* expert_out, const float* weights, int n_tokens, int top_k, int dim, float* y,
                     cudaStream_t stream);

}  // namespace moonrun::cuda
