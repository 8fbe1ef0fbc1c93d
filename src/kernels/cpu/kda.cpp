// Kimi Delta Attention on the CPU, float32 throughout (K3_SPEC.md §2).
//
// What the reference computes (modeling_kimi_linear.py KimiDeltaAttention with FLA's
// chunk_kda / fused_recurrent_kda, use_qk_l2norm_in_kernel, use_gate_in_kernel,
// use_beta_sigmoid_in_kernel):
//   q,k,v   = SiLU(causal depthwise conv_K(proj(x)))            [T, H*d] each
//   q,k     = per head x / sqrt(sum(x^2) + 1e-6);  q *= d^-1/2
//   g       = gate(f_b(f_a(x)) + dt_bias)  (log decay per head and channel, <= 0)
//   beta    = sigmoid(b_proj(x))                                  [T, H]
//   S_t     = Diag(exp(g_t)) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T;  o_t = S_t^T q_t
//   out     = o_proj(rmsnorm_head(o) * o_norm * sigmoid(gate_out(x)))
// The recurrence has two equivalent evaluation orders: token by token (decode) and the
// chunked WY form (prefill). Both live here and are tested against each other.
#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include "common/check.h"

namespace moonrun::cpu {

namespace {

// Runs fn(h) for h in [0, n), split over the CPU threads when the work is worth a thread.
template <typename Fn>
void parallel_heads(int n, int64_t work_per_item, Fn fn) {
  int n_threads = std::min(cpu_threads(), n);
  if (n_threads <= 1 || work_per_item * n < (1 << 16)) {
    for (int h = 0; h < n; ++h) fn(h);
    return;
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < n_threads; ++k) {
    threads.emplace_back([&, k] {
      for (int h = k; h < n; h += n_threads) fn(h);
    });
  }
  for (auto& t : threads) t.join();
}

// FLA's l2norm: x / sqrt(sum(x^2) + eps), eps 1e-6, over one head's d values.
void l2norm_inplace(float* x, int d, float scale) {
  float ss = 0;
  for (int i = 0; i < d; ++i) ss += x[i] * x[i];
  float inv = scale / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < d; ++i) x[i] *= inv;
}

}  // namespace

void KdaCache::reset(const KdaDims& dims) {
  const size_t window = static_cast<size_t>(dims.conv_kernel - 1) * dims.proj_dim();
  conv_q.assign(window, 0.0f);
  conv_k.assign(window, 0.0f);
  conv_v.assign(window, 0.0f);
  S.assign(static_cast<size_t>(dims.num_heads) * dims.head_dim * dims.head_dim, 0.0f);
}

// y[t, c] = silu(sum_{j<K} weight[c, j] * in[t - (K-1) + j, c]), where in[s] for s < 0 reads
// the window (the K-1 inputs before this call, oldest first). This is torch's Conv1d with
// left padding K-1 (weight index K-1 multiplies the current input) and FLA's conv cache
// [D, K] with its first column dropped. The window then holds the last K-1 inputs.
void short_conv_silu(const float* x, int n_tokens, int dim, const float* weight, int kernel,
                     float* window, float* y) {
  const int past = kernel - 1;
  // The input timeline: the window's rows followed by this call's rows.
  auto input = [&](int s, int c) -> float {
    return s < 0 ? window[static_cast<int64_t>(past + s) * dim + c]
                 : x[static_cast<int64_t>(s) * dim + c];
  };
  for (int t = 0; t < n_tokens; ++t) {
    for (int c = 0; c < dim; ++c) {
      const float* wc = weight + static_cast<int64_t>(c) * kernel;
      float acc = 0;  // oldest tap first, as FLA accumulates
      for (int j = 0; j < kernel; ++j) acc += wc[j] * input(t - past + j, c);
      y[static_cast<int64_t>(t) * dim + c] = acc * sigmoid(acc);
    }
  }
  // Roll the window: keep the last K-1 rows of [window; x].
  if (past == 0) return;
  std::vector<float> next(static_cast<size_t>(past) * dim);
  for (int r = 0; r < past; ++r) {
    int s = n_tokens - past + r;
    for (int c = 0; c < dim; ++c) next[static_cast<size_t>(r) * dim + c] = input(s, c);
  }
  std::copy(next.begin(), next.end(), window);
}

// The reference recurrence, one token at a time, in the order of FLA's
// fused_recurrent_kda: decay, delta-rule correction scaled by beta, rank-1 update, read-out.
void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                   float* o) {
  const int H = num_heads, d = head_dim;
  parallel_heads(H, static_cast<int64_t>(n_tokens) * d * d * 4, [&](int h) {
    float* Sh = S + static_cast<int64_t>(h) * d * d;  // [d_k, d_v]
    std::vector<float> u(d), decay(d);
    for (int t = 0; t < n_tokens; ++t) {
      const int64_t row = (static_cast<int64_t>(t) * H + h) * d;
      const float* qt = q + row;
      const float* kt = k + row;
      const float* vt = v + row;
      const float* gt = g + row;
      const float bt = beta[static_cast<int64_t>(t) * H + h];
      for (int i = 0; i < d; ++i) decay[i] = std::exp(gt[i]);
      // S <- Diag(exp(g)) S;  u = v - S^T k
      for (int j = 0; j < d; ++j) u[j] = vt[j];
      for (int i = 0; i < d; ++i) {
        float* Si = Sh + static_cast<int64_t>(i) * d;
        const float di = decay[i], ki = kt[i];
        for (int j = 0; j < d; ++j) {
          Si[j] *= di;
          u[j] -= ki * Si[j];
        }
      }
      // S += k (beta u)^T;  o = S^T q
      float* ot = o + row;
      for (int j = 0; j < d; ++j) {
        u[j] *= bt;
        ot[j] = 0;
      }
      for (int i = 0; i < d; ++i) {
        float* Si = Sh + static_cast<int64_t>(i) * d;
        const float ki = kt[i], qi = qt[i];
        for (int j = 0; j < d; ++j) {
          Si[j] += ki * u[j];
          ot[j] += qi * Si[j];
        }
      }
    }
  });
}

// The chunked (WY) form of the same recurrence (FLA naive_chunk_kda), for a chunk of C tokens
// with in-chunk cumulative log decays G_c = sum_{s<=c} g_s (per channel):
//   L[c][i]  = beta_c * sum_d k_c k_i exp(G_c - G_i)          (i < c, strictly lower)
//   T        = (I + L)^-1 Diag(beta)
//   W = T (exp(G) * k),  U = T v                              (the WY representation)
//   V'       = U - W S                                        (the pseudo-values)
//   o_c      = (q_c * exp(G_c)) S + sum_{j<=c} [sum_d q_c k_j exp(G_c - G_j)] V'_j
//   S        = Diag(exp(G_last)) S + sum_j (k_j * exp(G_last - G_j)) V'_j^T
// Only exponents <= 0 are ever evaluated (each pair is formed with j <= c), so nothing
// overflows however strong the decay is. A partial last chunk is just a smaller C.
void kda_chunked(const float* q, const float* k, const float* v, const float* g,
                 const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                 float* o, int chunk_size) {
  const int H = num_heads, d = head_dim;
  MR_CHECK(chunk_size > 0) << "chunk_size " << chunk_size;
  parallel_heads(H, static_cast<int64_t>(n_tokens) * d * (chunk_size + d) * 4, [&](int h) {
    float* Sh = S + static_cast<int64_t>(h) * d * d;  // [d_k, d_v]
    const int Cmax = chunk_size;
    // Per-chunk scratch, row-major [C, d] / [C, C].
    std::vector<float> qc(Cmax * d), kc(Cmax * d), vc(Cmax * d), G(Cmax * d), bc(Cmax);
    std::vector<float> A(Cmax * Cmax), Wm(Cmax * d), U(Cmax * d), Vp(Cmax * d), ek(Cmax * d);
    for (int t0 = 0; t0 < n_tokens; t0 += Cmax) {
      const int C = std::min(Cmax, n_tokens - t0);
      // Gather this head's rows and the cumulative log decay.
      for (int c = 0; c < C; ++c) {
        const int64_t row = (static_cast<int64_t>(t0 + c) * H + h) * d;
        std::copy(q + row, q + row + d, &qc[c * d]);
        std::copy(k + row, k + row + d, &kc[c * d]);
        std::copy(v + row, v + row + d, &vc[c * d]);
        for (int i = 0; i < d; ++i) G[c * d + i] = g[row + i] + (c ? G[(c - 1) * d + i] : 0.0f);
        bc[c] = beta[static_cast<int64_t>(t0 + c) * H + h];
      }
      // A <- -L (strictly lower), then forward substitution turns it into (I + L)^-1 - I.
      std::fill(A.begin(), A.end(), 0.0f);
      for (int c = 1; c < C; ++c) {
        for (int i = 0; i < c; ++i) {
          float s = 0;
          for (int x = 0; x < d; ++x)
            s += kc[c * d + x] * kc[i * d + x] * std::exp(G[c * d + x] - G[i * d + x]);
          A[c * Cmax + i] = -bc[c] * s;
        }
      }
      for (int c = 1; c < C; ++c) {
        // Row c of (I + L)^-1: A[c, :c] += sum_{m in (i, c)} A[c, m] * A[m, :c] with the
        // rows m < c already final.
        for (int i = 0; i < c; ++i) {
          float s = A[c * Cmax + i];
          for (int m = i + 1; m < c; ++m) s += A[c * Cmax + m] * A[m * Cmax + i];
          A[c * Cmax + i] = s;
        }
      }
      // T = (A + I) Diag(beta):  W = T (exp(G) k),  U = T v.
      for (int c = 0; c < C; ++c)
        for (int x = 0; x < d; ++x) ek[c * d + x] = std::exp(G[c * d + x]) * kc[c * d + x];
      for (int c = 0; c < C; ++c) {
        float* wr = &Wm[c * d];
        float* ur = &U[c * d];
        for (int x = 0; x < d; ++x) {
          wr[x] = bc[c] * ek[c * d + x];
          ur[x] = bc[c] * vc[c * d + x];
        }
        for (int j = 0; j < c; ++j) {
          const float a = A[c * Cmax + j] * bc[j];
          for (int x = 0; x < d; ++x) {
            wr[x] += a * ek[j * d + x];
            ur[x] += a * vc[j * d + x];
          }
        }
      }
      // V' = U - W S
      for (int c = 0; c < C; ++c) {
        float* vp = &Vp[c * d];
        std::copy(&U[c * d], &U[c * d] + d, vp);
        for (int i = 0; i < d; ++i) {
          const float wi = Wm[c * d + i];
          const float* Si = Sh + static_cast<int64_t>(i) * d;
          for (int j = 0; j < d; ++j) vp[j] -= wi * Si[j];
        }
      }
      // Outputs: the inter-chunk part through S, the intra-chunk part through V'.
      for (int c = 0; c < C; ++c) {
        float* oc = o + (static_cast<int64_t>(t0 + c) * H + h) * d;
        std::fill(oc, oc + d, 0.0f);
        for (int i = 0; i < d; ++i) {
          const float qi = qc[c * d + i] * std::exp(G[c * d + i]);
          const float* Si = Sh + static_cast<int64_t>(i) * d;
          for (int j = 0; j < d; ++j) oc[j] += qi * Si[j];
        }
        for (int j = 0; j <= c; ++j) {
          float a = 0;
          for (int x = 0; x < d; ++x)
            a += qc[c * d + x] * kc[j * d + x] * std::exp(G[c * d + x] - G[j * d + x]);
          const float* vp = &Vp[j * d];
          for (int y = 0; y < d; ++y) oc[y] += a * vp[y];
        }
      }
      // State to the end of the chunk.
      const float* Glast = &G[(C - 1) * d];
      for (int i = 0; i < d; ++i) {
        float* Si = Sh + static_cast<int64_t>(i) * d;
        const float di = std::exp(Glast[i]);
        for (int j = 0; j < d; ++j) Si[j] *= di;
        for (int c = 0; c < C; ++c) {
          const float kd = kc[c * d + i] * std::exp(Glast[i] - G[c * d + i]);
          const float* vp = &Vp[c * d];
          for (int j = 0; j < d; ++j) Si[j] += kd * vp[j];
        }
      }
    }
  });
}

void kda_forward(const KdaWeights& w, const KdaDims& dims, const float* x, int n_tokens,
                 KdaCache& cache, float* out, KdaMode mode) {
  const int H = dims.num_heads, d = dims.head_dim, D = dims.proj_dim(), K = dims.conv_kernel;
  const int T = n_tokens;
  if (T <= 0) return;
  if (cache.S.empty()) cache.reset(dims);
  MR_CHECK_EQ(cache.S.size(), static_cast<size_t>(H) * d * d);
  MR_CHECK_EQ(cache.conv_q.size(), static_cast<size_t>(K - 1) * D);
  MR_CHECK_EQ(w.q_conv.size(), static_cast<size_t>(D) * K);
  MR_CHECK_EQ(w.A_log.size(), static_cast<size_t>(H));
  MR_CHECK_EQ(w.dt_bias.size(), static_cast<size_t>(D));
  MR_CHECK_EQ(w.o_norm.size(), static_cast<size_t>(d));

  const size_t TD = static_cast<size_t>(T) * D;
  std::vector<float> proj(TD), q(TD), k(TD), v(TD);  // [T, H*d]
  // q, k, v: projection, then the short conv (each with its own window).
  apply(w.q_proj, x, T, proj.data());
  short_conv_silu(proj.data(), T, D, w.q_conv.data(), K, cache.conv_q.data(), q.data());
  apply(w.k_proj, x, T, proj.data());
  short_conv_silu(proj.data(), T, D, w.k_conv.data(), K, cache.conv_k.data(), k.data());
  apply(w.v_proj, x, T, proj.data());
  short_conv_silu(proj.data(), T, D, w.v_conv.data(), K, cache.conv_v.data(), v.data());

  // L2 norm per head (the reference does it inside the kernel), q scaled by d^-1/2.
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t r = 0; r < static_cast<int64_t>(T) * H; ++r) {
    l2norm_inplace(&q[r * d], d, scale);
    l2norm_inplace(&k[r * d], d, 1.0f);
  }

  // The decay gate, in fp32 from raw = f_b(f_a(x)) + dt_bias.
  std::vector<float> low(static_cast<size_t>(T) * w.f_a_proj.out_features);
  apply(w.f_a_proj, x, T, low.data());
  std::vector<float> g(TD);  // [T, H, d]
  apply(w.f_b_proj, low.data(), T, g.data());
  const bool lower_bound_gate = !std::isnan(dims.gate_lower_bound);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const float a = std::exp(w.A_log[h]);
      float* gr = &g[(static_cast<size_t>(t) * H + h) * d];
      const float* bias = &w.dt_bias[static_cast<size_t>(h) * d];
      for (int i = 0; i < d; ++i) {
        const float raw = gr[i] + bias[i];
        gr[i] = lower_bound_gate ? dims.gate_lower_bound * sigmoid(a * raw)  // K3 safe gate
                                 : -a * softplus(raw);                       // Kimi Linear
      }
    }
  }
  std::vector<float> beta(static_cast<size_t>(T) * H);  // [T, H]
  apply(w.b_proj, x, T, beta.data());
  for (float& b : beta) b = sigmoid(b);

  std::vector<float> o(TD);  // [T, H, d]
  const bool recurrent = mode == KdaMode::kRecurrent || (mode == KdaMode::kAuto && T == 1);
  if (recurrent) {
    kda_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, d, cache.S.data(),
                  o.data());
  } else {
    kda_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, d, cache.S.data(),
                o.data());
  }

  // Output gate (full rank in K3, low rank in Kimi Linear), reusing g's buffer.
  float* gate = g.data();
  if (!w.g_proj.empty()) {
    apply(w.g_proj, x, T, gate);
  } else {
    std::vector<float> glow(static_cast<size_t>(T) * w.g_a_proj.out_features);
    apply(w.g_a_proj, x, T, glow.data());
    apply(w.g_b_proj, glow.data(), T, gate);
  }
  // FusedRMSNormGated(sigmoid): rmsnorm over each head's d values, times weight, times
  // sigmoid(gate), all in fp32.
  rmsnorm(o.data(), T * H, d, w.o_norm.data(), dims.norm_eps, o.data());
  for (size_t i = 0; i < TD; ++i) o[i] *= sigmoid(gate[i]);
  apply(w.o_proj, o.data(), T, out);
}

}  // namespace moonrun::cpu
