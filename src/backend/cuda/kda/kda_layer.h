#pragma once
// Kimi Delta Attention on the GPU: the twin of cpu::kda_forward (kernels/cpu/kda.h, whose
// comment has the math) and of its pieces. One sequence per call, n_tokens new tokens;
// projections through Blas (bf16 in, fp32 out), everything after them in fp32, the state
// (conv windows and S) fp32 in device memory owned by the caller.
#include <cuda_runtime_api.h>

#include "backend/cpu/kda.h"
#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gemm/blas.h"

namespace moonrun::cuda {

struct DeviceKdaWeights {
  DeviceLinear q_proj, k_proj, v_proj;          // [H*d, hidden]
  const float* q_conv = nullptr;                // [H*d, conv_kernel] fp32
  const float* k_conv = nullptr;
  const float* v_conv = nullptr;
  const float* A_log = nullptr;                 // [H]
  const float* dt_bias = nullptr;               // [H*d]
  DeviceLinear f_a_proj, f_b_proj;              // [d, hidden], [H*d, d]
  DeviceLinear b_proj;                          // [H, hidden]
  DeviceLinear g_proj;                          // [H*d, hidden] (full-rank gate), or
  DeviceLinear g_a_proj, g_b_proj;              // [d, hidden], [H*d, d] (low-rank gate)
  const float* o_norm = nullptr;                // [d]
  DeviceLinear o_proj;                          // [hidden, H*d]
};
DeviceKdaWeights upload_kda(DeviceArena& arena, const cpu::KdaWeights& w);

// One sequence's state in one KDA layer (device pointers, fp32, zeroed for a new sequence).
struct DeviceKdaState {
  float* conv_q = nullptr;  // [conv_kernel-1, H*d], oldest row first (as cpu::KdaCache)
  float* conv_k = nullptr;
  float* conv_v = nullptr;
  float* S = nullptr;       // [H, d_k, d_v]
};
// Floats one DeviceKdaState needs (3 windows + S), for carving a slot pool.
int64_t kda_state_floats(const cpu::KdaDims& dims);
// Lays a state out over `floats` (kda_state_floats(dims) floats, device).
DeviceKdaState kda_state_at(float* floats, const cpu::KdaDims& dims);

// x [n_tokens, hidden] bf16 (input_layernorm'ed) -> out [n_tokens, hidden] fp32; updates
// state. mode as cpu::KdaMode (kAuto: recurrent for one token, chunked otherwise).
void kda_forward(Blas& blas, const DeviceKdaWeights& w, const cpu::KdaDims& dims, const bf16* x, int n_tokens,
                 const DeviceKdaState& state, float* out, Scratch& scratch,
                 cpu::KdaMode mode = cpu::KdaMode::kAuto);

// Scratch bytes kda_forward takes for n_tokens (for sizing the arena's scratch region).
size_t kda_scratch_bytes(const DeviceKdaWeights& w, const cpu::KdaDims& dims, int n_tokens);

// The pieces (twins of the CPU functions of the same names), for the op tests:
void short_conv_silu(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                     float* y, cudaStream_t stream);
void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   int n_tokens, int num_heads, int head_dim, float* S, float* o, cudaStream_t stream);
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int n_tokens, int num_heads, int head_dim, float* S, float* o, cudaStream_t stream,
                 int chunk_size = 64);

// Additions (this header's owner) for the layer and the bit-exact tests:
// short_conv_silu with the SiLU optional (apply_silu false: the plain conv, so integer inputs
// can be compared bit for bit).
void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                bool apply_silu, float* y, cudaStream_t stream);
// kda_chunked on a caller-provided workspace of kda_chunked_workspace_floats(...) floats (the
// layer takes it from Scratch; the overload above allocates its own, stream-ordered).
// chunk_size in [1, 64]; head_dim <= 256 here and in kda_recurrent.
int64_t kda_chunked_workspace_floats(int n_tokens, int num_heads, int head_dim, int chunk_size = 64);
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int n_tokens, int num_heads, int head_dim, float* S, float* o, float* workspace,
                 cudaStream_t stream, int chunk_size = 64);

}  // namespace moonrun::cuda
