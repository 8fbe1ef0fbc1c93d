#pragma once
// Gated multi-head latent attention with NoPE on the CPU (K3_SPEC.md §2). One sequence at a
// time. The cache holds, per token, the normalised latent (kv_lora) followed by k_pe (rope
// dims, never rotated in K3/Kimi Linear): 576 floats per token per layer at K3 size.
#include <vector>

#include "kernels/cpu/linear.h"

namespace moonrun::cpu {

struct MlaDims {
  int hidden = 0;
  int num_heads = 0;
  int q_lora_rank = 0;      // 0: no q LoRA (q_proj)
  int kv_lora_rank = 0;     // 512 in K3
  int qk_nope_head_dim = 0; // 128
  int qk_rope_head_dim = 0; // 64
  int v_head_dim = 0;       // 128
  bool output_gate = false; // mla_use_output_gate
  float q_a_norm_eps = 1e-6f, kv_a_norm_eps = 1e-6f;
  int cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct MlaWeights {
  Linear q_a_proj;                      // [q_lora, hidden]
  std::vector<float> q_a_layernorm;     // [q_lora]
  Linear q_b_proj;                      // [H*(nope+rope), q_lora]
  Linear q_proj;                        // [H*(nope+rope), hidden] when q_lora_rank == 0
  Linear kv_a_proj_with_mqa;            // [kv_lora+rope, hidden]
  std::vector<float> kv_a_layernorm;    // [kv_lora]
  Linear kv_b_proj;                     // [H*(nope+v), kv_lora]
  Linear o_proj;                        // [hidden, H*v]
  Linear g_proj;                        // [H*v, hidden] when output_gate
};

enum class MlaMode {
  kAuto,      // absorbed when n_tokens == 1, plain otherwise
  kPlain,     // expand kv_b over the cache: per-head keys and values (prefill)
  kAbsorbed,  // fold kv_b into q and the output: MQA directly over the 576-wide rows (decode)
};

// rows[p] points at the cache row (cache_row() floats) of position p, for p in
// [0, n_past + n_tokens). The n_tokens new rows are written here; rows before n_past are
// read. x: [n_tokens, hidden] (input_layernorm'ed); out: [n_tokens, hidden]. Causal.
void mla_forward(const MlaWeights& w, const MlaDims& dims, const float* x, int n_tokens,
                 int n_past, float* const* rows, float* out, MlaMode mode = MlaMode::kAuto);

}  // namespace moonrun::cpu
