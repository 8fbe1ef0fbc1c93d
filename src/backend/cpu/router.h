#pragma once
// The MoE router (K3_SPEC.md §2, the reference's KimiMoEGate, DeepSeek-V3 "noaux_tc"):
// s = sigmoid(logits); choose top-k by s + e_score_correction_bias, first keeping the
// topk_group best groups (group score = sum of its top-2 biased scores) when
// num_expert_group > topk_group; weights = unbiased s of the chosen, renormalised
// (/ (sum + 1e-20)) when top_k > 1 and renormalize, times routed_scaling_factor.
#include "backend/ops.h"

namespace moonrun::cpu {

// One token: logits [num_experts] (fp32 router output), bias [num_experts] (may be null).
// expert_ids/weights: [top_k], in order of decreasing biased score (ties: lower id first).
void route_token(const float* logits, const float* bias, const RouterParams& p, int* expert_ids,
                 float* weights);

}  // namespace moonrun::cpu
