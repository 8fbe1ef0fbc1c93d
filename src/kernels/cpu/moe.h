#pragma once
// The MoE block (K3_SPEC.md §2): router on the full-width x; the routed experts run in the
// LatentMoE space (routed_expert_down_proj, then RMSNorm and routed_expert_up_proj after the
// weighted sum); the shared experts are a dense MLP on x.
#include <cstdint>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/mlp.h"
#include "kernels/cpu/router.h"

namespace moonrun::cpu {

struct MoeDims {
  int hidden = 0;
  int io_dim = 0;  // routed experts' width: routed_expert_hidden_size, or hidden when not latent
  RouterParams router;
  ActivationParams act;
  float norm_eps = 1e-5f;  // routed_expert_norm (rms_norm_eps)
};

// One routed-expert matrix [out, in] as stored in MXFP4 (cpu/mxfp4.h's layout), kept packed
// for the GPU's W4A16 kernels.
struct Mxfp4Matrix {
  std::vector<uint8_t> codes;   // [out, in/2]
  std::vector<uint8_t> scales;  // [out, in/32]
  int out_features = 0;
  int in_features = 0;
};
struct PackedExpert {
  Mxfp4Matrix gate, up, down;  // w1, w3, w2
};

struct MoeWeights {
  Linear router;                    // [num_experts, hidden]
  std::vector<float> router_bias;   // [num_experts] e_score_correction_bias (fp32)
  std::vector<MlpWeights> experts;  // [num_experts], each at io_dim (w1=gate, w3=up, w2=down)
  // [num_experts] when loaded with WeightLoadOptions::mxfp4_packed (then `experts` is empty).
  std::vector<PackedExpert> packed_experts;
  MlpWeights shared;                // intermediate moe_intermediate * num_shared; empty if none
  Linear latent_down;               // [io_dim, hidden]; empty when not latent
  Linear latent_up;                 // [hidden, io_dim]
  std::vector<float> latent_norm;   // [io_dim]; empty when latent_moe_use_norm is false
};

// x: [n_tokens, hidden] (post_attention_layernorm'ed) -> out: [n_tokens, hidden].
void moe_forward(const MoeWeights& w, const MoeDims& dims, const float* x, int n_tokens, float* out);

}  // namespace moonrun::cpu
