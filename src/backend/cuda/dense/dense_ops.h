#pragma once
// The small per-token ops of the forward on the GPU, each the twin of a CPU op:
// embedding (cpu/embedding.h), RMSNorm (cpu::rmsnorm), the AttnRes mix (cpu::attn_res_mix),
// SiTU / SwiGLU (cpu/activations.h), residual adds, and the dense gated MLP
// (cpu::mlp_forward). Residual-stream tensors stay fp32; the inputs of projections are bf16.
// All functions enqueue on `stream` and check their launches.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cpu/mlp.h"
#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gemm/blas.h"

namespace moonrun::cuda {

// out[t] = table[ids[t]]; table [vocab, hidden] bf16, ids [n_tokens] (device, < vocab),
// out [n_tokens, hidden] fp32.
void embed_tokens(const bf16* table, int hidden, const int32_t* ids, int n_tokens, float* out,
                  cudaStream_t stream);

// y = weight * (x / sqrt(mean(x^2) + eps)) per row of [n_rows, dim], fp32 math.
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, bf16* y, cudaStream_t stream);
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y, cudaStream_t stream);

// cpu::attn_res_mix on the device. blocks: a DEVICE array of n_blocks device pointers,
// each [n_tokens, hidden] fp32. out may alias prefix.
void attn_res_mix(const float* prefix, const float* const* blocks, int n_blocks, int n_tokens, int hidden,
                  const float* w_norm, const float* w_proj, float eps, float* out, cudaStream_t stream);

// out = act(gate, up) elementwise (SiTU or SwiGLU per act), fp32 math, bf16 out.
// gate, up, out: n elements.
void gated_activation(const float* gate, const float* up, int64_t n, const cpu::ActivationParams& act, bf16* out,
                      cudaStream_t stream);

// y = a + b (n elements); y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
// y = bf16(x).
void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream);

// The gated MLP (dense layer, shared experts): down(act(gate(x), up(x))).
struct DeviceMlpWeights {
  DeviceLinear gate, up, down;  // [inter, in], [inter, in], [in, inter]
  bool empty() const { return gate.empty(); }
};
DeviceMlpWeights upload_mlp(DeviceArena& arena, const cpu::MlpWeights& w);
// x [n_tokens, in] bf16 -> out [n_tokens, in] fp32. Temporaries come from scratch.
void mlp_forward(Blas& blas, const DeviceMlpWeights& w, const cpu::ActivationParams& act, const bf16* x,
                 int n_tokens, float* out, Scratch& scratch);

}  // namespace moonrun::cuda
