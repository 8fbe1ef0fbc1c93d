#pragma once
// Gated NoPE MLA on the GPU: the twin of cpu::mla_forward (kernels/cpu/mla.h). One sequence
// per call. The latent cache is paged and bf16: per token per MLA layer one row of
// cache_row() = kv_lora + rope values (576 at K3 size), written for the new tokens and read
// for all positions [0, n_past + n_tokens).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/mla.h"
#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gemm/blas.h"

namespace moonrun::cuda {

struct DeviceMlaWeights {
  DeviceLinear q_a_proj;                 // [q_lora, hidden] (q_lora_rank > 0)
  const float* q_a_layernorm = nullptr;  // [q_lora]
  DeviceLinear q_b_proj;                 // [H*(nope+rope), q_lora]
  DeviceLinear q_proj;                   // [H*(nope+rope), hidden] (q_lora_rank == 0)
  DeviceLinear kv_a_proj_with_mqa;       // [kv_lora+rope, hidden]
  const float* kv_a_layernorm = nullptr; // [kv_lora]
  DeviceLinear kv_b_proj;                // [H*(nope+v), kv_lora]
  DeviceLinear o_proj;                   // [hidden, H*v]
  DeviceLinear g_proj;                   // [H*v, hidden] (output_gate)
};
DeviceMlaWeights upload_mla(DeviceArena& arena, const cpu::MlaWeights& w);

// One MLA layer's slice of the paged pool: rows at
// layer_base + (page * page_size_tokens + offset) * row, bf16.
struct DeviceMlaCache {
  bf16* layer_base = nullptr;
  int page_size_tokens = 0;
  int num_pages = 0;
  const int32_t* pages = nullptr;  // device page table of this sequence, covering n_past + n_tokens
};

// x [n_tokens, hidden] bf16 (input_layernorm'ed) -> out [n_tokens, hidden] fp32. Causal;
// position n_past + t attends to [0, n_past + t]. mode as cpu::MlaMode (kAuto: absorbed for
// one token, plain otherwise).
void mla_forward(Blas& blas, const DeviceMlaWeights& w, const cpu::MlaDims& dims, const bf16* x, int n_tokens,
                 int n_past, const DeviceMlaCache& cache, float* out, Scratch& scratch,
                 cpu::MlaMode mode = cpu::MlaMode::kAuto);

// Bytes mla_forward takes from Scratch for that call (released when it returns). Plain mode
// dominates: kv_b over every visible position in fp32, (n_past + n_tokens) * H * (nope + v) * 4
// bytes (98 KiB per position at K3 size), so size the scratch for the longest context that is
// prefilled in plain mode.
size_t mla_scratch_bytes(const cpu::MlaDims& dims, int n_tokens, int n_past, cpu::MlaMode mode = cpu::MlaMode::kAuto);

}  // namespace moonrun::cuda
