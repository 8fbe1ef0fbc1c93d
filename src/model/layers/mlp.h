#pragma once
// The gated MLP (K3_SPEC.md §2): down(act(gate(x), up(x))) with SiTU (K3) or SwiGLU (Kimi
// Linear). The dense first layer and the shared experts; the routed experts run the same
// math inside Ops::moe_experts.
#include "backend/ops.h"

namespace moonrun {

struct MlpWeights {
  Matrix gate;  // [inter, in]
  Matrix up;    // [inter, in]
  Matrix down;  // [in, inter]
  bool empty() const { return gate.empty(); }
};

// Its matrices in the order a step reads them (a prefetch hint's list; issue #41).
inline std::vector<Tensor> mlp_weights_read_order(const MlpWeights& m) { return {m.gate.w, m.up.w, m.down.w}; }

// x [T, in] act dtype -> out [T, in] F32. reduce = false leaves out as this rank's partial
// sum (its intermediate slice), for a caller that adds to it before one all-reduce.
void mlp_forward(Ops& ops, const MlpWeights& w, const ActivationParams& act, const Tensor& x, Tensor out,
                 bool reduce = true);

}  // namespace moonrun
