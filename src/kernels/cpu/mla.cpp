// Gated multi-head latent attention with NoPE on the CPU, float32 (K3_SPEC.md §2; the
// reference is modeling_kimi_linear.py KimiMLAAttention with eager attention).
//
//   q           = q_b(RMSNorm(q_a(x)))  or  q_proj(x)           [T, H, nope | pe]
//   [c | k_pe]  = kv_a_proj_with_mqa(x);  c = RMSNorm(c)         cache row [kv_lora | pe]
//   [k_nope|v]  = kv_b(c)  per head;  key = [k_nope | k_pe]      (k_pe shared by all heads)
//   o_h         = softmax_causal(q_h . key_h * (nope+pe)^-1/2) v_h
//   out         = o_proj(o * sigmoid(g_proj(x)))   (the gate only when mla_use_output_gate)
// No rotary anywhere: the "rope" slice is used as is.
//
// Two evaluation orders of the same math:
//   plain    — expand kv_b over every cached row (per-head keys and values), then attend.
//   absorbed — fold W_uk (the k_nope rows of kv_b) into the query and W_uv (the v rows) into
//              the output, so each head attends directly over the [kv_lora | pe] rows:
//              q_h . key_h(p) = (W_uk_h^T q_nope_h) . c(p) + q_pe_h . k_pe(p)
//              o_h            = W_uv_h (sum_p a_p c(p))
#include "kernels/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>

#include "common/check.h"

namespace moonrun::cpu {

namespace {

// In-place softmax over n scores (max-subtracted, fp32 as the reference's softmax dtype).
void softmax_inplace(float* s, int n) {
  float m = s[0];
  for (int i = 1; i < n; ++i) m = std::max(m, s[i]);
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
}

// Attention with per-head keys and values expanded from the latent rows.
// q: [T, H, nope+pe]; o: [T, H, v].
void attend_plain(const MlaWeights& w, const MlaDims& dims, const float* q, int n_tokens,
                  int n_past, const float* const* rows, float* o) {
  const int H = dims.num_heads, L = dims.kv_lora_rank, R = dims.qk_rope_head_dim;
  const int N = dims.qk_nope_head_dim, V = dims.v_head_dim, QD = dims.q_head_dim();
  const int P = n_past + n_tokens;
  const int KV = N + V;  // kv_b output per head
  const float scale = 1.0f / std::sqrt(static_cast<float>(QD));
  // Every visible latent row through kv_b: [P, H, nope | v].
  std::vector<float> latents(static_cast<size_t>(P) * L);
  for (int p = 0; p < P; ++p) std::copy(rows[p], rows[p] + L, &latents[static_cast<size_t>(p) * L]);
  std::vector<float> kv(static_cast<size_t>(P) * H * KV);
  apply(w.kv_b_proj, latents.data(), P, kv.data());
  parallel_heads(H, static_cast<int64_t>(n_tokens) * P * (QD + V), [&](int h) {
    std::vector<float> scores(P);
    for (int t = 0; t < n_tokens; ++t) {
      const float* qt = q + (static_cast<int64_t>(t) * H + h) * QD;
      const int visible = n_past + t + 1;  // causal: positions 0 .. n_past + t
      for (int p = 0; p < visible; ++p) {
        const float* kn = &kv[(static_cast<size_t>(p) * H + h) * KV];
        const float* kpe = rows[p] + L;
        scores[p] = (dot(qt, kn, N) + dot(qt + N, kpe, R)) * scale;
      }
      softmax_inplace(scores.data(), visible);
      float* ot = o + (static_cast<int64_t>(t) * H + h) * V;
      std::fill(ot, ot + V, 0.0f);
      for (int p = 0; p < visible; ++p) {
        const float* vp = &kv[(static_cast<size_t>(p) * H + h) * KV + N];
        const float a = scores[p];
        for (int j = 0; j < V; ++j) ot[j] += a * vp[j];
      }
    }
  });
}

// The same attention with kv_b absorbed: multi-query attention over the latent rows.
void attend_absorbed(const MlaWeights& w, const MlaDims& dims, const float* q, int n_tokens,
                     int n_past, const float* const* rows, float* o) {
  const int H = dims.num_heads, L = dims.kv_lora_rank, R = dims.qk_rope_head_dim;
  const int N = dims.qk_nope_head_dim, V = dims.v_head_dim, QD = dims.q_head_dim();
  const int P = n_past + n_tokens;
  const int KV = N + V;
  const float scale = 1.0f / std::sqrt(static_cast<float>(QD));
  const float* kv_b = w.kv_b_proj.w.data();  // [H * (nope + v), kv_lora]
  parallel_heads(H, static_cast<int64_t>(n_tokens) * (P * (L + R) + (N + V) * L), [&](int h) {
    const float* W_uk = kv_b + static_cast<int64_t>(h) * KV * L;  // [nope, kv_lora]
    const float* W_uv = W_uk + static_cast<int64_t>(N) * L;       // [v, kv_lora]
    std::vector<float> q_lat(L), o_lat(L), scores(P);
    for (int t = 0; t < n_tokens; ++t) {
      const float* qt = q + (static_cast<int64_t>(t) * H + h) * QD;
      // q_lat = W_uk^T q_nope
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int n = 0; n < N; ++n) {
        const float qn = qt[n];
        const float* wr = W_uk + static_cast<int64_t>(n) * L;
        for (int l = 0; l < L; ++l) q_lat[l] += qn * wr[l];
      }
      const int visible = n_past + t + 1;
      for (int p = 0; p < visible; ++p)
        scores[p] = (dot(q_lat.data(), rows[p], L) + dot(qt + N, rows[p] + L, R)) * scale;
      softmax_inplace(scores.data(), visible);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int p = 0; p < visible; ++p) {
        const float a = scores[p];
        for (int l = 0; l < L; ++l) o_lat[l] += a * rows[p][l];
      }
      // o = W_uv o_lat
      float* ot = o + (static_cast<int64_t>(t) * H + h) * V;
      for (int j = 0; j < V; ++j) ot[j] = dot(W_uv + static_cast<int64_t>(j) * L, o_lat.data(), L);
    }
  });
}

}  // namespace

void mla_forward(const MlaWeights& w, const MlaDims& dims, const float* x, int n_tokens,
                 int n_past, float* const* rows, float* out, MlaMode mode) {
  const int H = dims.num_heads, L = dims.kv_lora_rank, R = dims.qk_rope_head_dim;
  const int QD = dims.q_head_dim(), V = dims.v_head_dim;
  const int T = n_tokens;
  if (T <= 0) return;
  MR_CHECK_EQ(w.kv_b_proj.out_features, H * (dims.qk_nope_head_dim + V));
  MR_CHECK_EQ(w.kv_b_proj.in_features, L);
  MR_CHECK_EQ(w.kv_a_proj_with_mqa.out_features, L + R);
  MR_CHECK_EQ(w.kv_a_layernorm.size(), static_cast<size_t>(L));
  MR_CHECK_EQ((dims.q_lora_rank > 0 ? w.q_b_proj : w.q_proj).out_features, H * QD);
  MR_CHECK_EQ(w.o_proj.in_features, H * V);
  MR_CHECK(!dims.output_gate || w.g_proj.out_features == H * V) << "g_proj";

  // Queries [T, H, nope | pe].
  std::vector<float> q(static_cast<size_t>(T) * H * QD);
  if (dims.q_lora_rank > 0) {
    std::vector<float> qa(static_cast<size_t>(T) * dims.q_lora_rank);
    apply(w.q_a_proj, x, T, qa.data());
    rmsnorm(qa.data(), T, dims.q_lora_rank, w.q_a_layernorm.data(), dims.q_a_norm_eps,
            qa.data());
    apply(w.q_b_proj, qa.data(), T, q.data());
  } else {
    apply(w.q_proj, x, T, q.data());
  }

  // New cache rows: [RMSNorm(latent) | k_pe].
  std::vector<float> ckv(static_cast<size_t>(T) * (L + R));
  apply(w.kv_a_proj_with_mqa, x, T, ckv.data());
  for (int t = 0; t < T; ++t) {
    const float* src = &ckv[static_cast<size_t>(t) * (L + R)];
    float* row = rows[n_past + t];
    rmsnorm(src, 1, L, w.kv_a_layernorm.data(), dims.kv_a_norm_eps, row);
    std::copy(src + L, src + L + R, row + L);
  }

  std::vector<float> o(static_cast<size_t>(T) * H * V);  // [T, H * v]
  const bool absorbed = mode == MlaMode::kAbsorbed || (mode == MlaMode::kAuto && T == 1);
  if (absorbed) {
    attend_absorbed(w, dims, q.data(), T, n_past, rows, o.data());
  } else {
    attend_plain(w, dims, q.data(), T, n_past, rows, o.data());
  }

  if (dims.output_gate) {
    std::vector<float> gate(o.size());
    apply(w.g_proj, x, T, gate.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]);
  }
  apply(w.o_proj, o.data(), T, out);
}

}  // namespace moonrun::cpu
