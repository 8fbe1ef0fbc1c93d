// Kimi Delta Attention's pieces on the CPU, float32 throughout (K3_SPEC.md §2).
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
#include "backend/cpu/kda.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include "common/check.h"

namespace moonrun::cpu {

void l2norm_rows(float* x, int64_t n_rows, int d, float scale) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* xr = x + r * d;
    float ss = 0;
    for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = scale / std::sqrt(ss + 1e-6f);
    for (int i = 0; i < d; ++i) xr[i] *= inv;
  }
}

void kda_gate(float* g, int n_tokens, int num_heads, int head_dim, const float* A_log, const float* dt_bias,
              float lower_bound) {
  const int H = num_heads, d = head_dim;
  const bool bounded = !std::isnan(lower_bound);
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < H; ++h) {
      const float a = std::exp(A_log[h]);
      float* gr = g + (static_cast<int64_t>(t) * H + h) * d;
      const float* bias = dt_bias + static_cast<int64_t>(h) * d;
      for (int i = 0; i < d; ++i) {
        const float raw = gr[i] + bias[i];
        gr[i] = bounded ? lower_bound * sigmoid(a * raw)  // K3 safe gate
                        : -a * softplus(raw);             // Kimi Linear
      }
    }
  }
}

void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, float* y) {
  rmsnorm(o, static_cast<int>(n_rows), d, w, eps, y);
  for (int64_t i = 0; i < n_rows * d; ++i) y[i] *= sigmoid(gate[i]);
}

// y[t, c] = silu(sum_{j<K} weight[c, j] * in[t - (K-1) + j, c]), where in[s] for s < 0 reads
// the window (the K-1 inputs before this call, oldest first). This is torch's Conv1d with
// left padding K-1 (weight index K-1 multiplies the current input) and FLA's conv cache
// [D, K] with its first column dropped. The window then holds the last K-1 inputs.
void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                bool apply_silu, float* y) {
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
      y[static_cast<int64_t>(t) * dim + c] = apply_silu ? acc * sigmoid(acc) : acc;
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
//   L[c][i]  = beta_c * sum_x k_c k_i exp(G_c - G_i)          (i < c, strictly lower)
//   T        = (I + L)^-1 Diag(beta)
//   W = T (exp(G) * k),  U = T v                              (the WY representation)
//   V'       = U - W S                                        (the pseudo-values)
//   o_c      = (q_c * exp(G_c)) S + sum_{j<=c} P[c][j] V'_j,  P[c][j] = sum_x q_c k_j exp(G_c - G_j)
//   S        = Diag(exp(G_last)) S + sum_j (k_j * exp(G_last - G_j)) V'_j^T
// Only exponents <= 0 are ever evaluated, so nothing overflows however strong the decay.
// For the pair matrices L and P the rows are taken in blocks of kSub starting at r: a pair
// (c, j) with j < r <= c factors as exp(G_c - G_r) * exp(G_r - G_j), both factors <= 1, so
// the pair is a plain dot product of rescaled rows; pairs inside a block take their exps
// directly. A partial last chunk is just a smaller C.
namespace {

constexpr int kSub = 8;

// y[0..n) += a * x[0..n)
void axpy(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// One head's chunk scratch: row-major [C, d] and [C, C].
struct ChunkScratch {
  std::vector<float> q, k, v, G, beta;  // the chunk's rows and cumulative log decays
  std::vector<float> A, P;              // -L then (I+L)^-1 - I;  the q-k pair matrix
  std::vector<float> qs, ks, kt;        // rows rescaled to a block reference
  std::vector<float> ek, W, U, Vp;
  ChunkScratch(int C, int d)
      : q(C * d), k(C * d), v(C * d), G(C * d), beta(C), A(C * C), P(C * C), qs(C * d),
        ks(C * d), kt(C * d), ek(C * d), W(C * d), U(C * d), Vp(C * d) {}
};

// Fills A[c][j] = -L[c][j] (j < c) and P[c][j] (j <= c) for a chunk of C rows.
void pair_matrices(ChunkScratch& s, int C, int Cmax, int d) {
  std::fill(s.A.begin(), s.A.end(), 0.0f);
  std::fill(s.P.begin(), s.P.end(), 0.0f);
  for (int r = 0; r < C; r += kSub) {
    const int r_end = std::min(C, r + kSub);
    const float* Gr = &s.G[r * d];
    // Rows of this block relative to r; earlier rows relative to r from the other side.
    for (int c = r; c < r_end; ++c)
      for (int x = 0; x < d; ++x) {
        const float e = std::exp(s.G[c * d + x] - Gr[x]);
        s.qs[c * d + x] = s.q[c * d + x] * e;
        s.ks[c * d + x] = s.k[c * d + x] * e;
      }
    for (int j = 0; j < r; ++j)
      for (int x = 0; x < d; ++x) s.kt[j * d + x] = s.k[j * d + x] * std::exp(Gr[x] - s.G[j * d + x]);
    for (int c = r; c < r_end; ++c) {
      float* Ac = &s.A[c * Cmax];
      float* Pc = &s.P[c * Cmax];
      const float bc = s.beta[c];
      for (int j = 0; j < r; ++j) {
        Ac[j] = -bc * dot(&s.ks[c * d], &s.kt[j * d], d);
        Pc[j] = dot(&s.qs[c * d], &s.kt[j * d], d);
      }
      for (int j = r; j <= c; ++j) {
        float lk = 0, lq = 0;
        for (int x = 0; x < d; ++x) {
          const float kj = s.k[j * d + x] * std::exp(s.G[c * d + x] - s.G[j * d + x]);
          lk += s.k[c * d + x] * kj;
          lq += s.q[c * d + x] * kj;
        }
        if (j < c) Ac[j] = -bc * lk;
        Pc[j] = lq;
      }
    }
  }
}

}  // namespace

void kda_chunked(const float* q, const float* k, const float* v, const float* g,
                 const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                 float* o, int chunk_size) {
  const int H = num_heads, d = head_dim;
  MR_CHECK(chunk_size > 0) << "chunk_size " << chunk_size;
  parallel_heads(H, static_cast<int64_t>(n_tokens) * d * (chunk_size + d) * 4, [&](int h) {
    float* Sh = S + static_cast<int64_t>(h) * d * d;  // [d_k, d_v]
    const int Cmax = chunk_size;
    ChunkScratch s(Cmax, d);
    for (int t0 = 0; t0 < n_tokens; t0 += Cmax) {
      const int C = std::min(Cmax, n_tokens - t0);
      // Gather this head's rows and the cumulative log decay.
      for (int c = 0; c < C; ++c) {
        const int64_t row = (static_cast<int64_t>(t0 + c) * H + h) * d;
        std::copy(q + row, q + row + d, &s.q[c * d]);
        std::copy(k + row, k + row + d, &s.k[c * d]);
        std::copy(v + row, v + row + d, &s.v[c * d]);
        for (int x = 0; x < d; ++x)
          s.G[c * d + x] = g[row + x] + (c ? s.G[(c - 1) * d + x] : 0.0f);
        s.beta[c] = beta[static_cast<int64_t>(t0 + c) * H + h];
      }
      pair_matrices(s, C, Cmax, d);
      // Forward substitution: A = -L becomes (I + L)^-1 - I, row by row, using
      // X = N + N X with N = -L (row c needs the final rows m < c).
      for (int c = 1; c < C; ++c) {
        float* Ac = &s.A[c * Cmax];
        for (int i = 0; i < c; ++i) {
          float acc = Ac[i];
          for (int m = i + 1; m < c; ++m) acc += Ac[m] * s.A[m * Cmax + i];
          Ac[i] = acc;  // columns ascend, so Ac[m > i] still hold N
        }
      }
      // T = (A + I) Diag(beta):  W = T (exp(G) k),  U = T v.
      for (int c = 0; c < C; ++c)
        for (int x = 0; x < d; ++x) s.ek[c * d + x] = std::exp(s.G[c * d + x]) * s.k[c * d + x];
      for (int c = 0; c < C; ++c) {
        float* wr = &s.W[c * d];
        float* ur = &s.U[c * d];
        for (int x = 0; x < d; ++x) {
          wr[x] = s.beta[c] * s.ek[c * d + x];
          ur[x] = s.beta[c] * s.v[c * d + x];
        }
        for (int j = 0; j < c; ++j) {
          const float a = s.A[c * Cmax + j] * s.beta[j];
          axpy(a, &s.ek[j * d], wr, d);
          axpy(a, &s.v[j * d], ur, d);
        }
      }
      // V' = U - W S
      for (int c = 0; c < C; ++c) {
        float* vp = &s.Vp[c * d];
        std::copy(&s.U[c * d], &s.U[c * d] + d, vp);
        for (int i = 0; i < d; ++i) axpy(-s.W[c * d + i], Sh + static_cast<int64_t>(i) * d, vp, d);
      }
      // Outputs: the inter-chunk part through S, the intra-chunk part through V'.
      for (int c = 0; c < C; ++c) {
        float* oc = o + (static_cast<int64_t>(t0 + c) * H + h) * d;
        std::fill(oc, oc + d, 0.0f);
        for (int i = 0; i < d; ++i)
          axpy(s.q[c * d + i] * std::exp(s.G[c * d + i]), Sh + static_cast<int64_t>(i) * d, oc, d);
        for (int j = 0; j <= c; ++j) axpy(s.P[c * Cmax + j], &s.Vp[j * d], oc, d);
      }
      // State to the end of the chunk.
      const float* Glast = &s.G[(C - 1) * d];
      for (int i = 0; i < d; ++i) {
        float* Si = Sh + static_cast<int64_t>(i) * d;
        const float di = std::exp(Glast[i]);
        for (int j = 0; j < d; ++j) Si[j] *= di;
        for (int c = 0; c < C; ++c)
          axpy(s.k[c * d + i] * std::exp(Glast[i] - s.G[c * d + i]), &s.Vp[c * d], Si, d);
      }
    }
  });
}

}  // namespace moonrun::cpu
