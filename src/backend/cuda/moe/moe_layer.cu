// The MoE block on the GPU, step for step the CPU's cpu::moe_forward (kernels/cpu/moe.cpp,
// K3_SPEC.md §2 "MoE layer"):
//   logits = router(x_f32)                       fp32 GEMM (Blas::linear_f32, TF32 off)
//   ids, weights = router_topk(logits, bias)     cpu::route_token's choice and order
//   z = latent_down(x_bf16)                      bf16 out (or z = x_bf16 when not latent)
//   per slot (t, k): h = act(w1 z_t, w3 z_t); o = w2 h      grouped W4A16 / bf16 GEMMs
//   y_t = sum_k weights[t, k] o_(t,k)            fixed order
//   out = latent_up(RMSNorm(y)) (or y) + shared_experts(x_bf16)
// All on blas.stream(); temporaries from scratch; no host synchronisation.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_internal.h"

namespace moonrun::cuda {

namespace {

DeviceExpertMatrix upload_packed(DeviceArena& arena, const cpu::Mxfp4Matrix& m) {
  const size_t rows = static_cast<size_t>(m.out_features);
  if (m.in_features % 32 != 0 || m.codes.size() != rows * m.in_features / 2 ||
      m.scales.size() != rows * m.in_features / 32)
    throw CudaError("upload_moe: MXFP4 matrix [" + std::to_string(m.out_features) + ", " +
                    std::to_string(m.in_features) + "] with " + std::to_string(m.codes.size()) + " code bytes and " +
                    std::to_string(m.scales.size()) + " scales");
  DeviceExpertMatrix d;
  d.codes = arena.upload(m.codes, "moe expert codes");
  d.scales = arena.upload(m.scales, "moe expert scales");
  d.out_features = m.out_features;
  d.in_features = m.in_features;
  return d;
}

DeviceExpertMatrix upload_bf16(DeviceArena& arena, const cpu::Linear& lin) {
  const DeviceLinear d = upload_linear(arena, lin, "moe expert");
  DeviceExpertMatrix m;
  m.w = d.w;
  m.out_features = d.out_features;
  m.in_features = d.in_features;
  return m;
}

}  // namespace

DeviceMoeWeights upload_moe(DeviceArena& arena, const cpu::MoeWeights& w) {
  DeviceMoeWeights d;
  d.num_experts = w.router.out_features;
  d.router = arena.upload(w.router.w, "moe router");
  if (!w.router_bias.empty()) d.router_bias = arena.upload(w.router_bias, "moe router bias");
  d.mxfp4 = !w.packed_experts.empty();
  const size_t n = d.mxfp4 ? w.packed_experts.size() : w.experts.size();
  if (n != static_cast<size_t>(d.num_experts))
    throw CudaError("upload_moe: " + std::to_string(n) + " experts for a router of " + std::to_string(d.num_experts));
  for (size_t e = 0; e < n; ++e) {
    if (d.mxfp4) {
      d.w1.push_back(upload_packed(arena, w.packed_experts[e].gate));
      d.w3.push_back(upload_packed(arena, w.packed_experts[e].up));
      d.w2.push_back(upload_packed(arena, w.packed_experts[e].down));
    } else {
      d.w1.push_back(upload_bf16(arena, w.experts[e].gate));
      d.w3.push_back(upload_bf16(arena, w.experts[e].up));
      d.w2.push_back(upload_bf16(arena, w.experts[e].down));
    }
  }
  d.d_w1 = arena.upload(d.w1, "moe w1 descriptors");
  d.d_w3 = arena.upload(d.w3, "moe w3 descriptors");
  d.d_w2 = arena.upload(d.w2, "moe w2 descriptors");
  if (!w.shared.empty()) d.shared = upload_mlp(arena, w.shared);
  if (!w.latent_down.empty()) d.latent_down = upload_linear(arena, w.latent_down, "moe latent_down");
  if (!w.latent_up.empty()) d.latent_up = upload_linear(arena, w.latent_up, "moe latent_up");
  if (!w.latent_norm.empty()) d.latent_norm = arena.upload(w.latent_norm, "moe latent norm");
  return d;
}

void moe_forward(Blas& blas, const DeviceMoeWeights& w, const cpu::MoeDims& dims, const float* x_f32,
                 const bf16* x_bf16, int n_tokens, float* out, Scratch& scratch) {
  if (n_tokens <= 0) return;
  const int H = dims.hidden, D = dims.io_dim, E = dims.router.num_experts, K = dims.router.top_k;
  if (E != w.num_experts || w.w1.empty() || w.w1[0].in_features != D || w.w2[0].out_features != D ||
      (w.latent_up.empty() && D != H))
    throw CudaError("moe_forward: dims (hidden " + std::to_string(H) + ", io " + std::to_string(D) + ", " +
                    std::to_string(E) + " experts) do not match the weights");
  const int inter = w.w1[0].out_features;
  const int n_slots = n_tokens * K;
  const cudaStream_t stream = blas.stream();

  // Routing from the full-width x, in fp32.
  float* logits = scratch.take<float>(static_cast<size_t>(n_tokens) * E);  // [n_tokens, E]
  blas.linear_f32(x_f32, n_tokens, w.router, E, H, logits);
  int32_t* ids = scratch.take<int32_t>(n_slots);  // [n_tokens, K]
  float* weights = scratch.take<float>(n_slots);  // [n_tokens, K]
  router_topk(logits, w.router_bias, n_tokens, dims.router, ids, weights, stream);

  ExpertGroups groups;
  groups.offsets = scratch.take<int>(E + 1);
  groups.perm = scratch.take<int>(n_slots);
  groups.active = scratch.take<int>(E);
  groups.num_active = scratch.take<int>(1);
  group_by_expert(ids, n_slots, E, groups, stream);
  const int max_active = std::min(E, n_slots);

  // Into the latent space (bf16: the experts' input precision).
  const bf16* z = x_bf16;  // [n_tokens, D]
  if (!w.latent_down.empty()) {
    bf16* zl = scratch.take<bf16>(static_cast<size_t>(n_tokens) * D);
    blas.linear(x_bf16, n_tokens, w.latent_down, zl);
    z = zl;
  }

  // The routed experts, slot rows: gate/up read token rows of z (s / K), down reads slot rows.
  float* g = scratch.take<float>(static_cast<size_t>(n_slots) * inter);  // [n_slots, inter]
  float* u = scratch.take<float>(static_cast<size_t>(n_slots) * inter);  // [n_slots, inter]
  bf16* h = scratch.take<bf16>(static_cast<size_t>(n_slots) * inter);    // [n_slots, inter]
  float* o = scratch.take<float>(static_cast<size_t>(n_slots) * D);      // [n_slots, D]
  grouped_expert_linear(z, K, w.d_w1, w.w1[0], w.mxfp4, groups, max_active, g, stream);
  grouped_expert_linear(z, K, w.d_w3, w.w3[0], w.mxfp4, groups, max_active, u, stream);
  gated_activation(g, u, static_cast<int64_t>(n_slots) * inter, dims.act, h, stream);
  grouped_expert_linear(h, 1, w.d_w2, w.w2[0], w.mxfp4, groups, max_active, o, stream);

  // Weighted sum per token, then back to full width.
  if (!w.latent_up.empty()) {
    float* y = scratch.take<float>(static_cast<size_t>(n_tokens) * D);  // [n_tokens, D]
    bf16* yb = scratch.take<bf16>(static_cast<size_t>(n_tokens) * D);   // [n_tokens, D]
    combine_experts(o, weights, n_tokens, K, D, y, stream);
    if (w.latent_norm)
      rmsnorm(y, n_tokens, D, w.latent_norm, dims.norm_eps, yb, stream);
    else
      to_bf16(y, static_cast<int64_t>(n_tokens) * D, yb, stream);
    blas.linear(yb, n_tokens, w.latent_up, out);
  } else {
    combine_experts(o, weights, n_tokens, K, D, out, stream);
  }

  if (!w.shared.empty()) {
    float* shared = scratch.take<float>(static_cast<size_t>(n_tokens) * H);  // [n_tokens, hidden]
    mlp_forward(blas, w.shared, dims.act, x_bf16, n_tokens, shared, scratch);
    add(out, shared, static_cast<int64_t>(n_tokens) * H, out, stream);
  }
}

}  // namespace moonrun::cuda
