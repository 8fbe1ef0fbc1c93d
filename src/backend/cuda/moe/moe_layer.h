#pragma once
// The MoE block on the GPU: the twin of cpu::moe_forward (kernels/cpu/moe.h): router in fp32
// (cpu::route_token's rule), routed experts in the latent space as W4A16 GEMMs over the
// MXFP4 codes (dequantised in registers; K3_SPEC.md §3) or bf16 GEMMs for bf16 experts
// (Kimi Linear), the weighted combine, latent norm and up-projection, plus the shared
// experts. Deterministic: the same input gives bit-identical output.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/dense/dense_ops.h"
#include "backend/cuda/gemm/blas.h"

namespace moonrun::cuda {

// One expert matrix [out, in] in MXFP4 (codes [out, in/2], E8M0 scales [out, in/32],
// cpu/mxfp4.h's layout) or bf16.
struct DeviceExpertMatrix {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const bf16* w = nullptr;  // when not MXFP4
  int out_features = 0, in_features = 0;
};
struct DeviceMoeWeights {
  const float* router = nullptr;       // [num_experts, hidden] fp32
  const float* router_bias = nullptr;  // [num_experts] or null
  int num_experts = 0;
  bool mxfp4 = false;
  // Per expert e: w1 (gate) [inter, io], w3 (up) [inter, io], w2 (down) [io, inter].
  std::vector<DeviceExpertMatrix> w1, w3, w2;
  // The same descriptors in device memory ([num_experts] each), for kernels that index them.
  const DeviceExpertMatrix* d_w1 = nullptr;
  const DeviceExpertMatrix* d_w3 = nullptr;
  const DeviceExpertMatrix* d_w2 = nullptr;
  DeviceMlpWeights shared;             // empty when no shared experts
  DeviceLinear latent_down, latent_up; // empty when not latent
  const float* latent_norm = nullptr;  // [io_dim] or null
};
// Packed MXFP4 experts come from w.packed_experts when present, else the float experts
// are uploaded as bf16.
DeviceMoeWeights upload_moe(DeviceArena& arena, const cpu::MoeWeights& w);

// Router top-k for every token: logits [n_tokens, E] fp32 -> expert_ids, weights
// [n_tokens, top_k] (device), exactly cpu::route_token's choice and order.
void router_topk(const float* logits, const float* bias, int n_tokens, const cpu::RouterParams& p,
                 int32_t* expert_ids, float* weights, cudaStream_t stream);

// y[t, o] = sum_i x[t, i] * W[o, i] with W an MXFP4 matrix; x [n_tokens, in] bf16,
// y [n_tokens, out] fp32 (the W4A16 GEMM, tested alone against dequantise + matmul).
void mxfp4_linear(const bf16* x, int n_tokens, const DeviceExpertMatrix& w, float* y, cudaStream_t stream);

// x_f32/x_bf16: the same [n_tokens, hidden] input (post_attention_layernorm'ed) in both
// precisions (router in fp32, projections in bf16) -> out [n_tokens, hidden] fp32.
void moe_forward(Blas& blas, const DeviceMoeWeights& w, const cpu::MoeDims& dims, const float* x_f32,
                 const bf16* x_bf16, int n_tokens, float* out, Scratch& scratch);

}  // namespace moonrun::cuda
