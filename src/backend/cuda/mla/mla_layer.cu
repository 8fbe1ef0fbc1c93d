// Gated NoPE MLA layer on the GPU: the twin of cpu::mla_forward (kernels/cpu/mla.cpp,
// K3_SPEC.md §2 "Gated MLA layer"), same steps in the same order:
//
//   q           = q_b(RMSNorm(q_a(x)))  or  q_proj(x)            [T, H, nope | pe]   fp32
//   [c | k_pe]  = kv_a_proj_with_mqa(x);  row = [RMSNorm(c) | k_pe] -> paged cache (bf16)
//   plain:      kv = kv_b(c(0..P-1)),  o_h = softmax_causal(q_h . [k_nope_h | k_pe] * s) v_h
//   absorbed:   q_abs = [W_uk^T q_nope | q_pe],  o_lat = softmax_causal(q_abs . row * s) c,
//               o_h = W_uv_h o_lat_h
//   out         = o_proj(o * sigmoid(g_proj(x)))   (the gate only with mla_use_output_gate)
//
// with s = (nope + pe)^-1/2 and no rotary. Projections go through Blas::linear (bf16 in,
// fp32 out); the inputs of q_b and o_proj are rounded to bf16 there, like a bf16 model's
// activations. Everything runs on blas.stream(); temporaries come from `scratch` and are
// released when this call returns (stream order keeps that safe).
#include <algorithm>

#include "common/check.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/mla/mla_device.cuh"
#include "backend/cuda/mla/mla_kernels.h"
#include "backend/cuda/mla/mla_layer.h"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

// y = bf16(weight * (x / sqrt(mean(x^2) + eps))) per row of [n_rows, dim]: the q_a norm,
// whose output is q_b's bf16 input. One block per row.
__global__ void rmsnorm_to_bf16_kernel(const float* __restrict__ x, int dim, const float* __restrict__ weight,
                                       float eps, bf16* __restrict__ y) {
  __shared__ float red[kWarps];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  bf16* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0;
  for (int i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) yr[i] = __float2bfloat16_rn(weight[i] * (xr[i] * inv));
}

// o_bf16 = bf16(o * sigmoid(gate)) (gate may be null: no output gate), n elements: o_proj's input.
__global__ void gate_to_bf16_kernel(const float* __restrict__ o, const float* __restrict__ gate, int64_t n,
                                    bf16* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = o[i];
    if (gate) v *= 1.0f / (1.0f + expf(-gate[i]));
    y[i] = __float2bfloat16_rn(v);
  }
}

DeviceLinear upload_if_present(DeviceArena& arena, const cpu::Linear& lin, const char* what) {
  return lin.empty() ? DeviceLinear{} : upload_linear(arena, lin, what);
}

void check_linear(const DeviceLinear& lin, int out_features, int in_features, const char* what) {
  MR_CHECK(!lin.empty()) << "MLA weight missing: " << what;
  MR_CHECK(lin.out_features == out_features && lin.in_features == in_features)
      << what << " is [" << lin.out_features << ", " << lin.in_features << "], expected [" << out_features << ", "
      << in_features << "]";
}

bool use_absorbed(cpu::MlaMode mode, int n_tokens) {
  return mode == cpu::MlaMode::kAbsorbed || (mode == cpu::MlaMode::kAuto && n_tokens == 1);
}

}  // namespace

size_t mla_scratch_bytes(const cpu::MlaDims& dims, int n_tokens, int n_past, cpu::MlaMode mode) {
  const size_t T = n_tokens, P = static_cast<size_t>(n_past) + n_tokens, H = dims.num_heads;
  const size_t L = dims.kv_lora_rank, R = dims.qk_rope_head_dim, N = dims.qk_nope_head_dim, V = dims.v_head_dim;
  const size_t QL = dims.q_lora_rank;
  // Every take() of mla_forward, each rounded up to the arena's 256-byte alignment.
  size_t bytes = 0;
  auto take = [&](size_t n, size_t elem) { bytes += (n * elem + 255) / 256 * 256; };
  take(T * H * (N + R), 4);  // q
  if (QL > 0) {
    take(T * QL, 4);  // q_a output
    take(T * QL, 2);  // its norm, bf16
  }
  take(T * (L + R), 4);  // ckv
  take(T * H * V, 4);    // o
  if (use_absorbed(mode, n_tokens)) {
    take(T * H * (L + R), 4);  // q_abs
    take(T * H * L, 4);        // o_lat
    take(attention_partial_floats(n_tokens, dims.num_heads, static_cast<int>(P), dims.kv_lora_rank), 4);
  } else {
    take(P * L, 2);            // latents
    take(P * H * (N + V), 4);  // kv
    take(attention_partial_floats(n_tokens, dims.num_heads, static_cast<int>(P), dims.v_head_dim), 4);
  }
  if (dims.output_gate) take(T * H * V, 4);  // gate
  take(T * H * V, 2);                         // o_proj input
  return bytes + 256;                         // the first take's alignment
}

DeviceMlaWeights upload_mla(DeviceArena& arena, const cpu::MlaWeights& w) {
  DeviceMlaWeights d;
  d.q_a_proj = upload_if_present(arena, w.q_a_proj, "mla.q_a_proj");
  if (!w.q_a_layernorm.empty()) d.q_a_layernorm = arena.upload(w.q_a_layernorm, "mla.q_a_layernorm");
  d.q_b_proj = upload_if_present(arena, w.q_b_proj, "mla.q_b_proj");
  d.q_proj = upload_if_present(arena, w.q_proj, "mla.q_proj");
  d.kv_a_proj_with_mqa = upload_if_present(arena, w.kv_a_proj_with_mqa, "mla.kv_a_proj_with_mqa");
  if (!w.kv_a_layernorm.empty()) d.kv_a_layernorm = arena.upload(w.kv_a_layernorm, "mla.kv_a_layernorm");
  d.kv_b_proj = upload_if_present(arena, w.kv_b_proj, "mla.kv_b_proj");
  d.o_proj = upload_if_present(arena, w.o_proj, "mla.o_proj");
  d.g_proj = upload_if_present(arena, w.g_proj, "mla.g_proj");
  return d;
}

void mla_forward(Blas& blas, const DeviceMlaWeights& w, const cpu::MlaDims& dims, const bf16* x, int n_tokens,
                 int n_past, const DeviceMlaCache& cache, float* out, Scratch& scratch, cpu::MlaMode mode) {
  const int T = n_tokens;
  if (T <= 0) return;
  const int H = dims.num_heads, L = dims.kv_lora_rank, R = dims.qk_rope_head_dim;
  const int N = dims.qk_nope_head_dim, V = dims.v_head_dim, QD = dims.q_head_dim();
  const int P = n_past + T;  // positions visible to the last new token
  const cudaStream_t stream = blas.stream();

  // Shapes, as cpu::mla_forward checks them, plus the cache covering every position.
  MR_CHECK(n_past >= 0) << "n_past " << n_past;
  MR_CHECK(cache.layer_base && cache.pages && cache.page_size_tokens > 0) << "MLA cache not set up";
  // num_pages (of the layer's pool, or of the table) must at least hold P rows.
  MR_CHECK_LE(static_cast<int64_t>(P), static_cast<int64_t>(cache.num_pages) * cache.page_size_tokens)
      << "MLA cache pages do not cover n_past + n_tokens";
  check_linear(w.kv_a_proj_with_mqa, L + R, dims.hidden, "kv_a_proj_with_mqa");
  check_linear(w.kv_b_proj, H * (N + V), L, "kv_b_proj");
  check_linear(w.o_proj, dims.hidden, H * V, "o_proj");
  MR_CHECK(w.kv_a_layernorm != nullptr) << "kv_a_layernorm";
  if (dims.q_lora_rank > 0) {
    check_linear(w.q_a_proj, dims.q_lora_rank, dims.hidden, "q_a_proj");
    check_linear(w.q_b_proj, H * QD, dims.q_lora_rank, "q_b_proj");
    MR_CHECK(w.q_a_layernorm != nullptr) << "q_a_layernorm";
  } else {
    check_linear(w.q_proj, H * QD, dims.hidden, "q_proj");
  }
  if (dims.output_gate) check_linear(w.g_proj, H * V, dims.hidden, "g_proj");

  Scratch local(scratch.arena());  // everything below is released on return;
                                   // mla_scratch_bytes() lists the same takes

  // Queries [T, H, nope | pe].
  float* q = local.take<float>(static_cast<size_t>(T) * H * QD);
  if (dims.q_lora_rank > 0) {
    float* qa = local.take<float>(static_cast<size_t>(T) * dims.q_lora_rank);
    bf16* qa_normed = local.take<bf16>(static_cast<size_t>(T) * dims.q_lora_rank);
    blas.linear(x, T, w.q_a_proj, qa);
    rmsnorm_to_bf16_kernel<<<T, kThreads, 0, stream>>>(qa, dims.q_lora_rank, w.q_a_layernorm, dims.q_a_norm_eps,
                                                        qa_normed);
    CUDA_CHECK_LAUNCH();
    blas.linear(qa_normed, T, w.q_b_proj, q);
  } else {
    blas.linear(x, T, w.q_proj, q);
  }

  // The new cache rows [RMSNorm(latent) | k_pe] at positions n_past .. P - 1.
  float* ckv = local.take<float>(static_cast<size_t>(T) * (L + R));
  blas.linear(x, T, w.kv_a_proj_with_mqa, ckv);
  write_cache_rows(ckv, T, n_past, L, R, w.kv_a_layernorm, dims.kv_a_norm_eps, cache, stream);

  // Attention -> o [T, H * v] fp32.
  float* o = local.take<float>(static_cast<size_t>(T) * H * V);
  if (use_absorbed(mode, T)) {
    float* q_abs = local.take<float>(static_cast<size_t>(T) * H * (L + R));
    float* o_lat = local.take<float>(static_cast<size_t>(T) * H * L);
    float* partials = local.take<float>(attention_partial_floats(T, H, P, L));
    absorb_query(q, w.kv_b_proj.w, T, H, L, N, R, V, q_abs, stream);
    attend_absorbed(q_abs, cache, T, n_past, H, L, R, N, o_lat, partials, stream);
    expand_output(o_lat, w.kv_b_proj.w, T, H, L, N, V, o, stream);
  } else {
    // kv_b over every visible latent: [P, H, nope | v], fp32 so attention reads what the
    // projection computed (one bf16 rounding fewer than storing it).
    bf16* latents = local.take<bf16>(static_cast<size_t>(P) * L);
    float* kv = local.take<float>(static_cast<size_t>(P) * H * (N + V));
    float* partials = local.take<float>(attention_partial_floats(T, H, P, V));
    gather_latents(cache, P, L, R, latents, stream);
    blas.linear(latents, P, w.kv_b_proj, kv);
    attend_plain(q, kv, cache, T, n_past, H, L, N, R, V, o, partials, stream);
  }

  // Output gate, then o_proj.
  float* gate = nullptr;
  if (dims.output_gate) {
    gate = local.take<float>(static_cast<size_t>(T) * H * V);
    blas.linear(x, T, w.g_proj, gate);
  }
  bf16* o_in = local.take<bf16>(static_cast<size_t>(T) * H * V);
  const int64_t n_o = static_cast<int64_t>(T) * H * V;
  const int blocks = static_cast<int>(std::min<int64_t>((n_o + kThreads - 1) / kThreads, 4096));
  gate_to_bf16_kernel<<<blocks, kThreads, 0, stream>>>(o, gate, n_o, o_in);
  CUDA_CHECK_LAUNCH();
  blas.linear(o_in, T, w.o_proj, out);
}

}  // namespace moonrun::cuda
