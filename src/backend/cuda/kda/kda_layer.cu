// The KDA layer on the GPU, the twin of cpu::kda_forward (kernels/cpu/kda.cpp has the math):
//   q,k,v = SiLU(conv(proj(x)));  q,k L2-normalised per head, q *= d^-1/2
//   g     = gate(f_b(f_a(x)) + dt_bias);  beta = sigmoid(b_proj(x))
//   o     = recurrence (token by token, or the chunked WY form)
//   out   = o_proj(rmsnorm_head(o) * o_norm * sigmoid(gate_out(x)))
// Projections through Blas (bf16 in, fp32 out). Everything between them stays fp32; values
// become bf16 only where they feed a projection (the low-rank f_a / g_a outputs, and the
// gated o before o_proj), as a bf16 model stores its activations.
#include <cuda_runtime.h>

#include <cmath>

#include "common/check.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_internal.cuh"
#include "backend/cuda/kda/kda_layer.h"

namespace moonrun::cuda {

namespace {

using kda_detail::warp_allreduce_sum;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // row kernels: a warp per head row

unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch's softplus with threshold 20, as cpu::softplus.
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// FLA's l2norm over each head row: x * scale / sqrt(sum(x^2) + 1e-6). x [n_rows, d] in place.
__global__ void l2norm_rows_kernel(float* x, int64_t n_rows, int d, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;  // whole warps leave together
  float* xr = x + row * d;
  float ss = 0.0f;
  for (int i = lane; i < d; i += 32) ss += xr[i] * xr[i];
  ss = warp_allreduce_sum(ss);
  const float inv = scale / sqrtf(ss + 1e-6f);
  for (int i = lane; i < d; i += 32) xr[i] *= inv;
}

// The decay gate in place: g [T, H*d] holds f_b(f_a(x)) on entry, the log decay on exit.
// lower_bound finite: K3's safe gate lb * sigmoid(exp(A_log) raw); NaN: Kimi Linear's
// -exp(A_log) softplus(raw).
__global__ void decay_gate_kernel(float* g, int n_tokens, int H, int d, const float* __restrict__ A_log,
                                  const float* __restrict__ dt_bias, float lower_bound) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int D = H * d;
  if (idx >= static_cast<int64_t>(n_tokens) * D) return;
  const int hi = static_cast<int>(idx % D);  // h * d + i
  const float a = expf(A_log[hi / d]);
  const float raw = g[idx] + dt_bias[hi];
  g[idx] = isnan(lower_bound) ? -a * softplusf(raw) : lower_bound * sigmoidf(a * raw);
}

__global__ void sigmoid_kernel(float* x, int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) x[idx] = sigmoidf(x[idx]);
}

// FusedRMSNormGated(sigmoid): y = weight * o / sqrt(mean(o^2) + eps) * sigmoid(gate), per head
// row of d; o, gate [n_rows, d] fp32, y bf16 (the o_proj input).
__global__ void gated_rmsnorm_kernel(const float* __restrict__ o, const float* __restrict__ gate,
                                     const float* __restrict__ weight, int64_t n_rows, int d, float eps,
                                     bf16* __restrict__ y) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  const float* orow = o + row * d;
  float ss = 0.0f;
  for (int i = lane; i < d; i += 32) ss += orow[i] * orow[i];
  ss = warp_allreduce_sum(ss);
  const float inv = 1.0f / sqrtf(ss / d + eps);
  for (int i = lane; i < d; i += 32)
    y[row * d + i] = __float2bfloat16_rn(weight[i] * (orow[i] * inv) * sigmoidf(gate[row * d + i]));
}

DeviceLinear upload_optional(DeviceArena& arena, const cpu::Linear& lin, const char* what) {
  return lin.empty() ? DeviceLinear{} : upload_linear(arena, lin, what);
}

}  // namespace

DeviceKdaWeights upload_kda(DeviceArena& arena, const cpu::KdaWeights& w) {
  DeviceKdaWeights d;
  d.q_proj = upload_linear(arena, w.q_proj, "kda.q_proj");
  d.k_proj = upload_linear(arena, w.k_proj, "kda.k_proj");
  d.v_proj = upload_linear(arena, w.v_proj, "kda.v_proj");
  d.q_conv = arena.upload(w.q_conv, "kda.q_conv");
  d.k_conv = arena.upload(w.k_conv, "kda.k_conv");
  d.v_conv = arena.upload(w.v_conv, "kda.v_conv");
  d.A_log = arena.upload(w.A_log, "kda.A_log");
  d.dt_bias = arena.upload(w.dt_bias, "kda.dt_bias");
  d.f_a_proj = upload_linear(arena, w.f_a_proj, "kda.f_a_proj");
  d.f_b_proj = upload_linear(arena, w.f_b_proj, "kda.f_b_proj");
  d.b_proj = upload_linear(arena, w.b_proj, "kda.b_proj");
  d.g_proj = upload_optional(arena, w.g_proj, "kda.g_proj");
  d.g_a_proj = upload_optional(arena, w.g_a_proj, "kda.g_a_proj");
  d.g_b_proj = upload_optional(arena, w.g_b_proj, "kda.g_b_proj");
  d.o_norm = arena.upload(w.o_norm, "kda.o_norm");
  d.o_proj = upload_linear(arena, w.o_proj, "kda.o_proj");
  return d;
}

int64_t kda_state_floats(const cpu::KdaDims& dims) {
  const int64_t D = dims.proj_dim();
  return 3 * static_cast<int64_t>(dims.conv_kernel - 1) * D + static_cast<int64_t>(dims.num_heads) * dims.head_dim * dims.head_dim;
}

DeviceKdaState kda_state_at(float* floats, const cpu::KdaDims& dims) {
  const int64_t window = static_cast<int64_t>(dims.conv_kernel - 1) * dims.proj_dim();
  DeviceKdaState s;
  s.conv_q = floats;
  s.conv_k = floats + window;
  s.conv_v = floats + 2 * window;
  s.S = floats + 3 * window;
  return s;
}

size_t kda_scratch_bytes(const DeviceKdaWeights& w, const cpu::KdaDims& dims, int n_tokens) {
  if (n_tokens <= 0) return 0;
  const size_t T = n_tokens, D = dims.proj_dim(), H = dims.num_heads, kAlign = 256;
  // As kda_forward takes them: proj, q, k, v, g, o (fp32 [T, D]); beta; the bf16 low-rank
  // activations; the bf16 o_proj input; the chunked workspace (only the chunked path takes it).
  const size_t low = T * (w.f_a_proj.out_features + (w.g_proj.empty() ? w.g_a_proj.out_features : 0));
  const size_t floats = 6 * T * D + T * H + kda_chunked_workspace_floats(n_tokens, dims.num_heads, dims.head_dim);
  return floats * sizeof(float) + (low + T * D) * sizeof(bf16) + 12 * kAlign;
}

void kda_forward(Blas& blas, const DeviceKdaWeights& w, const cpu::KdaDims& dims, const bf16* x, int n_tokens,
                 const DeviceKdaState& state, float* out, Scratch& scratch, cpu::KdaMode mode) {
  const int H = dims.num_heads, d = dims.head_dim, D = dims.proj_dim(), K = dims.conv_kernel, T = n_tokens;
  if (T <= 0) return;
  MR_CHECK_EQ(w.q_proj.out_features, D);
  MR_CHECK_EQ(w.q_proj.in_features, dims.hidden);
  MR_CHECK_EQ(w.f_b_proj.out_features, D);
  MR_CHECK_EQ(w.f_b_proj.in_features, w.f_a_proj.out_features);
  MR_CHECK_EQ(w.b_proj.out_features, H);
  MR_CHECK_EQ(w.o_proj.in_features, D);
  MR_CHECK_EQ(w.o_proj.out_features, dims.hidden);
  MR_CHECK_EQ((w.g_proj.empty() ? w.g_b_proj : w.g_proj).out_features, D);
  MR_CHECK(w.q_conv && w.k_conv && w.v_conv && w.A_log && w.dt_bias && w.o_norm) << "kda weights not uploaded";
  const cudaStream_t stream = blas.stream();
  const int64_t TD = static_cast<int64_t>(T) * D;

  float* proj = scratch.take<float>(TD);  // [T, D] a projection before its conv; later the output gate
  float* q = scratch.take<float>(TD);     // [T, H, d]
  float* k = scratch.take<float>(TD);
  float* v = scratch.take<float>(TD);
  // q, k, v: projection, then the short conv (each with its own window).
  blas.linear(x, T, w.q_proj, proj);
  short_conv_silu(proj, T, D, w.q_conv, K, state.conv_q, q, stream);
  blas.linear(x, T, w.k_proj, proj);
  short_conv_silu(proj, T, D, w.k_conv, K, state.conv_k, k, stream);
  blas.linear(x, T, w.v_proj, proj);
  short_conv_silu(proj, T, D, w.v_conv, K, state.conv_v, v, stream);

  const int64_t rows = static_cast<int64_t>(T) * H;  // head rows of d
  l2norm_rows_kernel<<<blocks_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(q, rows, d, 1.0f / std::sqrt(static_cast<float>(d)));
  CUDA_CHECK_LAUNCH();
  l2norm_rows_kernel<<<blocks_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(k, rows, d, 1.0f);
  CUDA_CHECK_LAUNCH();

  // The decay gate from raw = f_b(f_a(x)) + dt_bias (the low-rank f_a output is a bf16
  // activation: it is the input of f_b).
  bf16* low = scratch.take<bf16>(static_cast<size_t>(T) * w.f_a_proj.out_features);
  float* g = scratch.take<float>(TD);  // [T, H, d]
  blas.linear(x, T, w.f_a_proj, low);
  blas.linear(low, T, w.f_b_proj, g);
  decay_gate_kernel<<<blocks_for(TD, kThreads), kThreads, 0, stream>>>(g, T, H, d, w.A_log, w.dt_bias,
                                                                       dims.gate_lower_bound);
  CUDA_CHECK_LAUNCH();
  float* beta = scratch.take<float>(rows);  // [T, H]
  blas.linear(x, T, w.b_proj, beta);
  sigmoid_kernel<<<blocks_for(rows, kThreads), kThreads, 0, stream>>>(beta, rows);
  CUDA_CHECK_LAUNCH();

  float* o = scratch.take<float>(TD);  // [T, H, d]
  const bool recurrent = mode == cpu::KdaMode::kRecurrent || (mode == cpu::KdaMode::kAuto && T == 1);
  if (recurrent) {
    kda_recurrent(q, k, v, g, beta, T, H, d, state.S, o, stream);
  } else {
    float* ws = scratch.take<float>(kda_chunked_workspace_floats(T, H, d));
    kda_chunked(q, k, v, g, beta, T, H, d, state.S, o, ws, stream);
  }

  // Output gate (full rank in K3, low rank in Kimi Linear) into proj's buffer.
  float* gate = proj;
  if (!w.g_proj.empty()) {
    blas.linear(x, T, w.g_proj, gate);
  } else {
    bf16* glow = scratch.take<bf16>(static_cast<size_t>(T) * w.g_a_proj.out_features);
    blas.linear(x, T, w.g_a_proj, glow);
    blas.linear(glow, T, w.g_b_proj, gate);
  }
  bf16* gated = scratch.take<bf16>(TD);  // [T, H*d], the o_proj input
  gated_rmsnorm_kernel<<<blocks_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(o, gate, w.o_norm, rows, d,
                                                                                 dims.norm_eps, gated);
  CUDA_CHECK_LAUNCH();
  blas.linear(gated, T, w.o_proj, out);
}

}  // namespace moonrun::cuda
