// The gated MLP on the GPU, the twin of cpu::mlp_forward (cpu/mlp.cpp):
//   out = down(act(gate(x), up(x)))
// gate and up come out of cuBLASLt in fp32, the activation is computed in fp32 and stored as
// bf16 (the input of the down projection, like every projection input), down writes fp32.
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/dense_ops.h"

namespace moonrun::cuda {

DeviceMlpWeights upload_mlp(DeviceArena& arena, const cpu::MlpWeights& w) {
  DeviceMlpWeights d;
  if (w.empty()) return d;
  d.gate = upload_linear(arena, w.gate, "mlp.gate_proj");
  d.up = upload_linear(arena, w.up, "mlp.up_proj");
  d.down = upload_linear(arena, w.down, "mlp.down_proj");
  return d;
}

void mlp_forward(Blas& blas, const DeviceMlpWeights& w, const cpu::ActivationParams& act, const bf16* x,
                 int n_tokens, float* out, Scratch& scratch) {
  if (n_tokens <= 0) return;
  const int inter = w.gate.out_features;
  if (w.up.out_features != inter || w.down.in_features != inter || w.gate.in_features != w.up.in_features)
    throw CudaError("mlp_forward: gate/up/down shapes do not chain");
  // The temporaries live until the caller's scratch rewinds; everything here runs on
  // blas.stream() in order, so a later user of that memory cannot overtake these kernels.
  const size_t n = static_cast<size_t>(n_tokens) * inter;
  float* g = scratch.take<float>(n);  // [n_tokens, inter]
  float* u = scratch.take<float>(n);  // [n_tokens, inter]
  bf16* h = scratch.take<bf16>(n);    // [n_tokens, inter] act(g, u)
  blas.linear(x, n_tokens, w.gate, g);
  blas.linear(x, n_tokens, w.up, u);
  gated_activation(g, u, static_cast<int64_t>(n), act, h, blas.stream());
  blas.linear(h, n_tokens, w.down, out);
}

}  // namespace moonrun::cuda
