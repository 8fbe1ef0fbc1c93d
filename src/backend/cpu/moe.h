#pragma once
// The routed experts of a MoE layer on the CPU, float32 (K3_SPEC.md §2; the reference's
// moe_infer grouping): each chosen expert runs once over the (token, k) slots that picked
// it, and the outputs are summed per token in top-k order. The router (router.h) and the
// latent / shared parts around it are the layer's (model/layers/moe.cpp).
#include <cstdint>
#include <functional>

#include "backend/ops.h"

namespace moonrun::cpu {

// One expert's matrices in float32: gate, up [inter, in], down [in, inter].
struct ExpertF32 {
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* down = nullptr;
  int inter = 0;
};
// Called once per chosen expert per call (MXFP4 experts are dequantised there).
using ExpertSource = std::function<ExpertF32(int expert)>;

// The gated MLP: out = down(act(gate x, up x)); x [n_tokens, in], out [n_tokens, in].
void gated_mlp(const float* x, int n_tokens, int in, const ExpertF32& w, const ActivationParams& act, float* out);

// y[t] = sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) over the experts held here:
// expert(e) is global expert first_expert + e for e < num_experts; choices of other experts
// (another expert-parallel rank's) add nothing. x, y [n_tokens, in]; ids, weights [n_tokens, top_k].
void moe_experts(const float* x, int n_tokens, int in, const int32_t* ids, const float* weights, int top_k,
                 int first_expert, int num_experts, const ExpertSource& expert, const ActivationParams& act, float* y);

}  // namespace moonrun::cpu
